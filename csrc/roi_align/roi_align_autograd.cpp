// Autograd for the RoIAlign operators (one level and several), registered in C++ as torchvision does: the forward
// operators' backward passes, and the backward operators' refusal of a second derivative (double backward).
//
// The Python route (torch.library.register_autograd) costs tens of microseconds of host time per call, most of it
// for the Tensor[] input of the multi-level operator, and a RoIAlign call's kernels take about 100 us: measured, it
// added about a third to a single roi_align call and more than its kernels' time to a multiscale_roi_align call.
// Here it is the ordinary C++ autograd node. The fake kernels stay in Python (yolo_fastdetect/ops), so that
// torch.compile and opcheck work as before.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace yolo_fastdetect {
namespace roi_align {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The operator below autograd, through the dispatcher (CPU, CUDA or fake kernels alike).
template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using ForwardSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                                                            double, int64_t, bool, bool);
using BackwardSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef,
                                     double, int64_t, bool, bool);
using MultiscaleForwardSignature = std::tuple<at::Tensor, at::Tensor>(at::TensorList, const at::Tensor&,
                                                                      const at::Tensor&, int64_t, int64_t,
                                                                      at::ArrayRef<double>, int64_t, bool, bool);
using MultiscaleBackwardSignature = std::vector<at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                            const at::Tensor&, c10::SymIntArrayRef,
                                                            at::ArrayRef<double>, int64_t, bool, bool);

// Options of a call that the backward pass needs, kept in the context's saved_data.
void save_options(AutogradContext* ctx, int64_t sampling_ratio, bool aligned, bool max_mode) {
  ctx->saved_data["sampling_ratio"] = sampling_ratio;
  ctx->saved_data["aligned"] = aligned;
  ctx->saved_data["max_mode"] = max_mode;
}

// The backward operators have no derivative of their own. Without an autograd kernel, torch's fallback let a second
// derivative through them (create_graph=True) come out zero, with only a deprecation warning; their nodes raise.
[[noreturn]] void refuse_double_backward(const char* op) {
  TORCH_CHECK(false, op, ": double backward (the gradient of its gradient) is not supported");
}

class RoIAlignFunction : public torch::autograd::Function<RoIAlignFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& rois,
                               int64_t pooled_height, int64_t pooled_width, double spatial_scale,
                               int64_t sampling_ratio, bool aligned, bool max_mode) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto op = find_op<ForwardSignature>("yolo_fastdetect::roi_align");
    auto [output, argmax] =
        op.call(input, rois, pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, max_mode);
    ctx->saved_data["input_shape"] = input.sym_sizes();
    ctx->saved_data["spatial_scale"] = spatial_scale;
    save_options(ctx, sampling_ratio, aligned, max_mode);
    ctx->save_for_backward({rois, argmax});
    ctx->mark_non_differentiable({argmax});
    return {output, argmax};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    static const auto op = find_op<BackwardSignature>("yolo_fastdetect::roi_align_backward");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor grad_input =
        op.call(grads[0], saved[0], saved[1], ctx->saved_data["input_shape"].toSymIntVector(),
                ctx->saved_data["spatial_scale"].toDouble(), ctx->saved_data["sampling_ratio"].toInt(),
                ctx->saved_data["aligned"].toBool(), ctx->saved_data["max_mode"].toBool());
    // One gradient per forward argument: input, then none for rois and the six options.
    variable_list result(8);
    result[0] = grad_input;
    return result;
  }
};

class RoIAlignBackwardFunction : public torch::autograd::Function<RoIAlignBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad_output, const at::Tensor& rois,
                               const at::Tensor& argmax, c10::SymIntArrayRef input_shape, double spatial_scale,
                               int64_t sampling_ratio, bool aligned, bool max_mode) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto op = find_op<BackwardSignature>("yolo_fastdetect::roi_align_backward");
    return {op.call(grad_output, rois, argmax, input_shape, spatial_scale, sampling_ratio, aligned, max_mode)};
  }

  static variable_list backward(AutogradContext*, const variable_list&) { refuse_double_backward("roi_align"); }
};

class MultiscaleRoIAlignFunction : public torch::autograd::Function<MultiscaleRoIAlignFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList features, const at::Tensor& rois,
                               const at::Tensor& roi_levels, int64_t pooled_height, int64_t pooled_width,
                               at::ArrayRef<double> spatial_scales, int64_t sampling_ratio, bool aligned,
                               bool max_mode) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto op = find_op<MultiscaleForwardSignature>("yolo_fastdetect::multiscale_roi_align");
    auto [output, argmax] = op.call(features, rois, roi_levels, pooled_height, pooled_width, spatial_scales,
                                    sampling_ratio, aligned, max_mode);
    std::vector<c10::SymInt> feature_shapes;
    for (const at::Tensor& map : features) {
      for (const c10::SymInt& size : map.sym_sizes()) feature_shapes.push_back(size);
    }
    ctx->saved_data["feature_shapes"] = feature_shapes;
    ctx->saved_data["spatial_scales"] = spatial_scales.vec();
    save_options(ctx, sampling_ratio, aligned, max_mode);
    ctx->save_for_backward({rois, roi_levels, argmax});
    ctx->mark_non_differentiable({argmax});
    return {output, argmax};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    static const auto op = find_op<MultiscaleBackwardSignature>("yolo_fastdetect::multiscale_roi_align_backward");
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<double> spatial_scales = ctx->saved_data["spatial_scales"].toDoubleVector();
    std::vector<at::Tensor> grad_features =
        op.call(grads[0], saved[0], saved[1], saved[2], ctx->saved_data["feature_shapes"].toSymIntVector(),
                spatial_scales, ctx->saved_data["sampling_ratio"].toInt(), ctx->saved_data["aligned"].toBool(),
                ctx->saved_data["max_mode"].toBool());
    // One gradient per level of features (the list counts as its tensors), then none for the other eight arguments.
    variable_list result(grad_features.begin(), grad_features.end());
    result.resize(grad_features.size() + 8);
    return result;
  }
};

class MultiscaleRoIAlignBackwardFunction : public torch::autograd::Function<MultiscaleRoIAlignBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& grad_output, const at::Tensor& rois,
                               const at::Tensor& roi_levels, const at::Tensor& argmax,
                               c10::SymIntArrayRef feature_shapes, at::ArrayRef<double> spatial_scales,
                               int64_t sampling_ratio, bool aligned, bool max_mode) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto op = find_op<MultiscaleBackwardSignature>("yolo_fastdetect::multiscale_roi_align_backward");
    return op.call(grad_output, rois, roi_levels, argmax, feature_shapes, spatial_scales, sampling_ratio, aligned,
                   max_mode);
  }

  static variable_list backward(AutogradContext*, const variable_list&) {
    refuse_double_backward("multiscale_roi_align");
  }
};

std::tuple<at::Tensor, at::Tensor> roi_align_autograd(const at::Tensor& input, const at::Tensor& rois,
                                                      int64_t pooled_height, int64_t pooled_width, double spatial_scale,
                                                      int64_t sampling_ratio, bool aligned, bool max_mode) {
  const variable_list result = RoIAlignFunction::apply(input, rois, pooled_height, pooled_width, spatial_scale,
                                                       sampling_ratio, aligned, max_mode);
  return {result[0], result[1]};
}

std::tuple<at::Tensor, at::Tensor> multiscale_roi_align_autograd(at::TensorList features, const at::Tensor& rois,
                                                                 const at::Tensor& roi_levels, int64_t pooled_height,
                                                                 int64_t pooled_width,
                                                                 at::ArrayRef<double> spatial_scales,
                                                                 int64_t sampling_ratio, bool aligned, bool max_mode) {
  const variable_list result = MultiscaleRoIAlignFunction::apply(
      features, rois, roi_levels, pooled_height, pooled_width, spatial_scales, sampling_ratio, aligned, max_mode);
  return {result[0], result[1]};
}

at::Tensor roi_align_backward_autograd(const at::Tensor& grad_output, const at::Tensor& rois, const at::Tensor& argmax,
                                       c10::SymIntArrayRef input_shape, double spatial_scale, int64_t sampling_ratio,
                                       bool aligned, bool max_mode) {
  return RoIAlignBackwardFunction::apply(grad_output, rois, argmax, input_shape, spatial_scale, sampling_ratio, aligned,
                                         max_mode)[0];
}

std::vector<at::Tensor> multiscale_roi_align_backward_autograd(const at::Tensor& grad_output, const at::Tensor& rois,
                                                               const at::Tensor& roi_levels, const at::Tensor& argmax,
                                                               c10::SymIntArrayRef feature_shapes,
                                                               at::ArrayRef<double> spatial_scales,
                                                               int64_t sampling_ratio, bool aligned, bool max_mode) {
  return MultiscaleRoIAlignBackwardFunction::apply(grad_output, rois, roi_levels, argmax, feature_shapes,
                                                   spatial_scales, sampling_ratio, aligned, max_mode);
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, Autograd, m) {
  m.impl("roi_align", &roi_align_autograd);
  m.impl("multiscale_roi_align", &multiscale_roi_align_autograd);
  m.impl("roi_align_backward", &roi_align_backward_autograd);
  m.impl("multiscale_roi_align_backward", &multiscale_roi_align_backward_autograd);
}

}  // namespace roi_align
}  // namespace yolo_fastdetect
