// JPEG files decoded as OpenCV decodes them for Ultralytics (cv2.imdecode with IMREAD_COLOR: BGR, EXIF orientation
// applied for a folder's imread, ignored for a list's JPEGs), a batch per call with the GIL released for all of it.
//
// Python decoder threads each need the GIL between two files, and the predictor's thread holds it for much of each
// batch: on the H200 host 15 threads decode 896 img/s alone and 268 beside one thread running pure Python. Here
// the files of a batch are read and decoded by threads of this library, with no Python between them. The decoder
// is torchvision's (libjpeg-turbo, as OpenCV's), called through the dispatcher; its RGB planes are written out as
// BGR rows. It gives cv2's bytes for the files `decodable` accepts (tested on baseline, progressive, 4:4:4, 4:2:0
// and gray JPEGs and every EXIF orientation); it declines the rest (CMYK and other Adobe colour transforms, 12-bit,
// arithmetic or lossless coding, a file without its EOI marker), which the caller decodes with imread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace yolo_fastdetect {
namespace jpeg_files {

// Whether `data` (a whole file) is a JPEG this decoder gives imread's bytes for: SOI first, EOI last, before the
// scan no Adobe APP14 segment and one frame header, Huffman baseline, extended or progressive, 8-bit, with 1 or 3
// components. Reads only inside [data, data + size).
inline bool decodable(const uint8_t* data, size_t size) {
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8 || data[size - 2] != 0xFF || data[size - 1] != 0xD9) return false;
  bool frame = false;
  size_t position = 2;
  while (position + 4 <= size) {
    if (data[position] != 0xFF) return false;
    const uint8_t marker = data[position + 1];
    if (marker == 0xFF) {  // a fill byte before the marker
      ++position;
      continue;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) return false;        // no parameters expected here
    if (marker == 0xD9) return false;                                              // EOI before any scan
    const size_t length = (size_t(data[position + 2]) << 8) | data[position + 3];  // counts its own two bytes
    if (length < 2 || length > size - position - 2) return false;
    const uint8_t* segment = data + position + 4;
    const size_t segment_size = length - 2;
    if (marker == 0xDA) return frame;  // start of scan: what came before decides
    if (marker == 0xEE && segment_size >= 5 && std::memcmp(segment, "Adobe", 5) == 0) return false;
    const bool start_of_frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                                marker != 0xCC;  // DHT, JPG and DAC share the range
    if (start_of_frame) {
      if (frame || marker > 0xC2 || segment_size < 6) return false;
      const uint8_t precision = segment[0], components = segment[5];
      if (precision != 8 || (components != 1 && components != 3)) return false;
      frame = true;
    }
    position += 2 + length;
  }
  return false;
}

}  // namespace jpeg_files
}  // namespace yolo_fastdetect
