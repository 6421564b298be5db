// YOLO12's area-attention block (Ultralytics' ABlock: AAttn, then the two-convolution MLP) of a fused model as one
// operator. It makes the ATen calls that the Python modules make, in their order and with their arguments, so its
// output is theirs bit for bit on every device; what it saves is the Python between them: one call from Python
// instead of about thirty-five, each of which releases the GIL and must take it back, where other threads (the
// validation loader's) are waiting for it. Registered for CompositeImplicitAutograd: autograd and torch.compile see
// the ATen calls themselves, so the operator needs neither a backward nor a fake kernel.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#include "../common.h"

namespace yolo_fastdetect {
namespace {

// The five convolutions in the order the block runs them; the SiLU follows kMlpIn.
enum Convolution : size_t { kQkv = 0, kPositional = 1, kProjection = 2, kMlpIn = 3, kMlpOut = 4, kCount = 5 };

// A fused Ultralytics Conv of stride 1 and dilation 1, as nn.Conv2d calls it (padding the same on both axes).
at::Tensor convolution(const at::Tensor& input, at::TensorList weights, at::TensorList biases, at::IntArrayRef paddings,
                       at::IntArrayRef groups, size_t index) {
  const int64_t padding = paddings[index];
  return at::conv2d(input, weights[index], biases[index], /*stride=*/{1, 1}, {padding, padding}, /*dilation=*/{1, 1},
                    groups[index]);
}

at::Tensor area_attention_block(const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                                at::IntArrayRef paddings, at::IntArrayRef groups, int64_t num_heads, int64_t area,
                                bool scale_queries) {
  TORCH_CHECK(x.dim() == 4, "area_attention_block: x must be (B, C, H, W), got ", text(x.dim()), " dimensions");
  for (const size_t count : {weights.size(), biases.size(), paddings.size(), groups.size()}) {
    TORCH_CHECK(count == kCount, "area_attention_block: weights, biases, paddings and groups must each hold 5 entries ",
                "(qkv, pe, proj, mlp.0, mlp.1), got ", text(count));
  }
  TORCH_CHECK(num_heads > 0 && area > 0, "area_attention_block: num_heads and area must be positive");
  const int64_t height = x.size(2), width = x.size(3);
  const int64_t head_dim = x.size(1) / num_heads, all_head_dim = head_dim * num_heads;
  int64_t batch = x.size(0), tokens = height * width;
  TORCH_CHECK(tokens % area == 0, "area_attention_block: H * W (", text(tokens), ") must be a multiple of area (",
              text(area), ")");

  // AAttn.forward
  at::Tensor qkv = convolution(x, weights, biases, paddings, groups, kQkv).flatten(2).transpose(1, 2);
  if (area > 1) {
    qkv = qkv.reshape({batch * area, tokens / area, all_head_dim * 3});
    batch = qkv.size(0);
    tokens = qkv.size(1);
  }
  const auto qkv_parts = qkv.view({batch, tokens, num_heads, head_dim * 3})
                             .permute({0, 2, 3, 1})
                             .split_with_sizes({head_dim, head_dim, head_dim}, 2);
  const at::Tensor &q = qkv_parts[0], &k = qkv_parts[1], &v = qkv_parts[2];
  // Python's head_dim ** -0.5: the C library's pow of the two doubles. Ultralytics 8.4.1xx on scales the queries,
  // earlier releases the product (which rounds otherwise).
  const double scale = std::pow(static_cast<double>(head_dim), -0.5);
  at::Tensor attention =
      scale_queries ? at::matmul(q.mul(scale).transpose(-2, -1), k) : at::matmul(q.transpose(-2, -1), k).mul(scale);
  attention = attention.softmax(-1);
  at::Tensor out = at::matmul(v, attention.transpose(-2, -1)).permute({0, 3, 1, 2});
  at::Tensor values = v.permute({0, 3, 1, 2});
  if (area > 1) {
    out = out.reshape({batch / area, tokens * area, all_head_dim});
    values = values.reshape({batch / area, tokens * area, all_head_dim});
    batch = out.size(0);
  }
  out = out.reshape({batch, height, width, all_head_dim}).permute({0, 3, 1, 2}).contiguous();
  values = values.reshape({batch, height, width, all_head_dim}).permute({0, 3, 1, 2}).contiguous();
  out = out + convolution(values, weights, biases, paddings, groups, kPositional);
  const at::Tensor attended = x + convolution(out, weights, biases, paddings, groups, kProjection);

  // ABlock.forward: x + attn(x), then that plus mlp(that)
  const at::Tensor hidden = at::silu(convolution(attended, weights, biases, paddings, groups, kMlpIn));
  return attended + convolution(hidden, weights, biases, paddings, groups, kMlpOut);
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CompositeImplicitAutograd, m) {
  m.impl("area_attention_block", &area_attention_block);
}

}  // namespace yolo_fastdetect
