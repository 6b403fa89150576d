// The extension module and every operator schema, defined once. Each backend registers
// its implementations with TORCH_LIBRARY_IMPL in csrc/cpu/ and csrc/cuda/; Python adds
// fake (meta) functions and autograd in seqkernels/ops/. The Python module exists only so
// that importing it runs these static registrations: there are no pybind11 bindings.
#include <Python.h>
#include <torch/library.h>

// PyMODINIT_FUNC exports the symbol despite -fvisibility=hidden.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", "seqkernels native operators (registered in torch.ops.seqkernels)", -1, nullptr};
  return PyModule_Create(&module_def);
}

TORCH_LIBRARY(seqkernels, m) {
  // One LSTM layer, one direction, the whole (packed) sequence in one call.
  // Shape legend: T steps, N = sum(batch_sizes) packed rows, B = batch_sizes[0], I input,
  // H hidden, P projection (Hout = P if w_hr is given else H), G = 4H gate rows (i, f, g, o).
  //   x           [N, I]  rows packed time-major: step t owns rows [sum(bs[:t]), sum(bs[:t+1]))
  //   batch_sizes [T]     int64 on the CPU, non-increasing, bs[0] == B (PackedSequence's)
  //   h0 [B, Hout], c0 [B, H], w_ih [G, I], w_hh [G, Hout], b_ih/b_hh [G] (both or neither),
  //   w_hr [P, H] (proj_size) or None
  //   reverse     run the sequences backwards in time (the second direction)
  //   training    save what backward needs (gates, cells); inference saves nothing
  // Returns y [N, Hout], h_n [B, Hout], c_n [B, H], gates [N or 0, G] (activated i, f, g, o),
  //   cells [N or 0, H] (c_t of every row).
  m.def(
      "lstm_forward(Tensor x, Tensor batch_sizes, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, "
      "Tensor? b_ih, Tensor? b_hh, Tensor? w_hr, bool reverse, bool training) "
      "-> (Tensor y, Tensor h_n, Tensor c_n, Tensor gates, Tensor cells)");
  // The functional lstm_layer where autograd records it (the modules' general path in an eager
  // training call: PackedSequence, projection, autocast): one autograd node in C++
  // (csrc/lstm_recorded.cpp) around lstm_forward / lstm_backward; below autograd, lstm_forward's
  // outputs without what it saves. Arguments as lstm_forward's, without training.
  // Returns y [N, Hout], h_n [B, Hout], c_n [B, H].
  m.def(
      "lstm_layer(Tensor x, Tensor batch_sizes, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, Tensor? b_ih, "
      "Tensor? b_hh, Tensor? w_hr, bool reverse) -> (Tensor y, Tensor h_n, Tensor c_n)");
  // The common module call as one operator, inference only (no autograd formula: it raises where
  // autograd would record it): one layer and direction of a stack without projection, a padded
  // sequence.
  //   input [T, B, I] ([B, T, I] if batch_first), h0 / c0 [1, B, H] or both None (zeros),
  //   w_ih [G, I], w_hh [G, H], b_ih / b_hh [G] (both or neither); reverse: from the last step
  //   to the first (a bidirectional layer's second direction; output stays in time order)
  // Returns output [T, B, H] ([B, T, H] if batch_first: a transposed view), h_n / c_n [1, B, H]:
  //   nn.LSTM's outputs.
  m.def(
      "lstm_infer(Tensor input, Tensor? h0, Tensor? c0, Tensor w_ih, Tensor w_hh, Tensor? b_ih, Tensor? b_hh, "
      "bool batch_first, bool reverse=False) -> (Tensor output, Tensor h_n, Tensor c_n)");
  // The same call where autograd records it (seqkernels.LSTM's eager training call): one autograd
  // node in C++ (csrc/lstm_recorded.cpp), with lstm_forward / lstm_backward inside; below autograd,
  // the outputs alone. Arguments and returns as lstm_infer's.
  m.def(
      "lstm_padded(Tensor input, Tensor? h0, Tensor? c0, Tensor w_ih, Tensor w_hh, Tensor? b_ih, Tensor? b_hh, "
      "bool batch_first, bool reverse=False) -> (Tensor output, Tensor h_n, Tensor c_n)");
  // One LSTMCell step where autograd records it (seqkernels.LSTMCell's eager training call): one
  // autograd node in C++ (csrc/lstm_recorded.cpp) around lstm_forward / lstm_backward of one step;
  // below autograd, the outputs alone.
  //   input [B, I], h0 / c0 [B, H] or both None (zeros), w_ih [G, I], w_hh [G, H], b_ih / b_hh [G]
  // Returns h, c [B, H]: nn.LSTMCell's.
  m.def(
      "lstm_cell(Tensor input, Tensor? h0, Tensor? c0, Tensor w_ih, Tensor w_hh, Tensor? b_ih, Tensor? b_hh) "
      "-> (Tensor h, Tensor c)");
  // Gradients of lstm_forward (training=True) given the gradients of y, h_n and c_n.
  // Returns grad_x [N, I], grad_h0 [B, Hout], grad_c0 [B, H], grad_w_ih [G, I],
  //   grad_w_hh [G, Hout], grad_bias [G] (the gradient of b_ih and of b_hh; [0] if has_bias
  //   is false), grad_w_hr [P, H] ([0, 0] without projection).
  m.def(
      "lstm_backward(Tensor grad_y, Tensor grad_h_n, Tensor grad_c_n, Tensor x, Tensor batch_sizes, "
      "Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, Tensor? w_hr, Tensor y, Tensor gates, "
      "Tensor cells, bool reverse, bool has_bias) "
      "-> (Tensor grad_x, Tensor grad_h0, Tensor grad_c0, Tensor grad_w_ih, Tensor grad_w_hh, "
      "Tensor grad_bias, Tensor grad_w_hr)");
  // lstm_backward where autograd records it (a double backward: create_graph=True), through its
  // autograd.Function, whose formula also reads b_ih and b_hh (implemented in Python,
  // seqkernels/ops/lstm.py; the C++ nodes of csrc/lstm_recorded.cpp call it). Returns lstm_backward's
  // outputs.
  m.def(
      "lstm_backward_recorded(Tensor grad_y, Tensor grad_h_n, Tensor grad_c_n, Tensor x, Tensor batch_sizes, "
      "Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, Tensor? w_hr, Tensor y, Tensor gates, "
      "Tensor cells, bool reverse, bool has_bias, Tensor? b_ih, Tensor? b_hh) "
      "-> (Tensor grad_x, Tensor grad_h0, Tensor grad_c0, Tensor grad_w_ih, Tensor grad_w_hh, "
      "Tensor grad_bias, Tensor grad_w_hr)");

  // The circulant ("wave") convolutional RNN, batch-first, the whole sequence in one call:
  //   h_t = act(x_t + conv(h_{t-1}) + bias), conv = conv1d cross-correlation (C -> C
  //   channels, width K, no bias) of h padded with K/2 values on the left and K-1-K/2 on the
  //   right: circularly around the ring (padding_mode 0) or with zeros (padding_mode 1).
  // Shape legend: B batch, T steps, C channels, N ring size, K kernel width.
  //   x [B, T, C, N], weight [C, C, K] (out, in, k), bias [C] or None, h0 [B, C, N]
  //   nonlinearity: 0 tanh, 1 relu
  // Returns y [B, T, C, N] (h_1 .. h_T) and h_T [B, C, N]. Backward needs only y and h0:
  // act'(pre) is 1 - y^2 for tanh and (y > 0) for relu.
  m.def(
      "convrnn_forward(Tensor x, Tensor weight, Tensor? bias, Tensor h0, int padding_mode, int nonlinearity) "
      "-> (Tensor y, Tensor h_T)");
  // Gradients of convrnn_forward given those of y and h_T (any strides: an expanded gradient
  // is read in place where the kernel can). Returns grad_x [B, T, C, N],
  // grad_weight [C, C, K], grad_bias [C] ([0] when has_bias is false), grad_h0 [B, C, N].
  m.def(
      "convrnn_backward(Tensor grad_y, Tensor grad_h_T, Tensor weight, Tensor h0, Tensor y, int padding_mode, "
      "int nonlinearity, bool has_bias) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias, Tensor grad_h0)");

  // One ConvLSTM layer (Shi et al., 2015), the whole sequence in one call, 'same' zero
  // padding (KH/2, KW/2), stride 1. Per step, with * the 2-D cross-correlation:
  //   z = w_ih * x_t + w_hh * h_{t-1} + bias;  i = sig(z_i + w_ci c_{t-1}), f = sig(z_f + w_cf c_{t-1}),
  //   g = tanh(z_g), c_t = f c_{t-1} + i g, o = sig(z_o + w_co c_t), h_t = o tanh(c_t).
  // Shape legend: T steps, B batch, Ci input channels, C hidden channels, G = 4C gate
  // channels (i, f, g, o), H x W the frame, KH x KW the (odd) kernel.
  //   x [T, B, Ci, H, W], h0/c0 [B, C, H, W], w_ih [G, Ci, KH, KW], w_hh [G, C, KH, KW],
  //   bias [G] (b_ih + b_hh) or None, peephole [3, C, H, W] (w_ci, w_cf, w_co) or None
  //   training    save what backward needs (gates, cells); inference saves nothing
  // Returns y [T, B, C, H, W] (h_1 .. h_T), h_n / c_n [B, C, H, W], and, saved for backward
  //   channels-last (the kernels' layout), gates [T, B, H, W, G] (activated i, f, g, o) and
  //   cells [T, B, H, W, C] (c_t); each [0] in inference.
  m.def(
      "convlstm_forward(Tensor x, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, Tensor? bias, "
      "Tensor? peephole, bool training) -> (Tensor y, Tensor h_n, Tensor c_n, Tensor gates, Tensor cells)");
  // Gradients of convlstm_forward (training=True) given those of y, h_n and c_n (None: zero).
  // Returns grad_x, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias [G] ([0] if has_bias
  //   is false), grad_peephole [3, C, H, W] ([0] without peepholes).
  m.def(
      "convlstm_backward(Tensor? grad_y, Tensor? grad_h_n, Tensor? grad_c_n, Tensor x, Tensor h0, Tensor c0, "
      "Tensor w_ih, Tensor w_hh, Tensor? peephole, Tensor y, Tensor gates, Tensor cells, bool has_bias) "
      "-> (Tensor grad_x, Tensor grad_h0, Tensor grad_c0, Tensor grad_w_ih, Tensor grad_w_hh, Tensor grad_bias, "
      "Tensor grad_peephole)");
}
