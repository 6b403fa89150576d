// The CPU ConvLSTM's convolutions by Winograd's minimal filtering (csrc/cpu/winograd.cpp).
//
// oneDNN's direct convolutions run near this class of CPU's float32 peak, and the fused loop
// spends most of its time in them, so only fewer multiplications make the loop faster: a
// 'same'-padded, stride-1 convolution with an r x r kernel computes each m x m tile of output
// from an n x n tile of input (n = m + r - 1) as Aᵀ[(G w Gᵀ) ⊙ (Bᵀ d B)]A: n·n multiplications
// per input and output channel pair for m·m outputs, against m·m·r·r directly. F(4x4, 3x3) on
// 6 x 6 tiles: 4x fewer; F(4x4, 5x5) on 8 x 8 tiles: 6.25x fewer. Summed over the input
// channels, the n·n elementwise products are n·n GEMMs [tiles, I]·[I, O] on the CPU BLAS.
//
// All three convolutions of training take this form:
//   forward       y = w * x (+ bias);
//   input grad    dx = w' * dy, with w'[i][o] = w[o][i] rotated by 180 degrees ('same' padding
//                 and an odd kernel make the transposed convolution a 'same' convolution);
//   weight grad   dw = Gᵀ [Σ_tiles (Bᵀ d B)ᵀ · (A dy Aᵀ)] G, the forward's chain rule in the
//                 transformed domain: n·n GEMMs [I, tiles]·[tiles, O].
//
// Accuracy (float32, against float64): the transforms' coefficients (up to 5.25 in Bᵀ, 8 in
// Aᵀ) grow the rounding error over the direct convolution's: err / max|y| ≈ 6e-6 (F(4x4, 5x5),
// 64 input channels) and 8.6e-6 (F(4x4, 3x3), 128) against 1.4e-6 directly (measured), inside
// the benchmark's float32 check (1e-4 of the magnitude) and the tolerance of the Winograd tests
// (5e-5 of the magnitude). float64 stays at ~1e-14.
//
// Shape legend: N frames, I input channels, O output channels, H x W the frame, r the kernel,
// m the output tile, n x n the input tile and its n·n transformed points.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace seqkernels::cpu {

// Which algorithm runs the CPU ConvLSTM's convolutions: SEQKERNELS_CONV_ALGO = auto (default:
// Winograd where `WinogradConv::chosen` says so), winograd (wherever it applies: float32 and float64,
// square 3 x 3 and 5 x 5 kernels), direct (ATen's oneDNN convolutions everywhere).
enum class ConvAlgo { kAuto, kWinograd, kDirect };
ConvAlgo conv_algo_from_env();

// The convolutions of one weight [O, I, r, r]. Activations are [N, C, H, W] tensors whose
// channels are contiguous (channels-last memory, any pixel strides); results are [N, C, H, W]
// in channels-last memory.
class WinogradConv {
 public:
  // Whether this weight's convolutions can run here (dtype and kernel), and whether they
  // should under SEQKERNELS_CONV_ALGO for frames of `pixels` pixels.
  static bool supports(const at::Tensor& weight);
  static bool chosen(const at::Tensor& weight, int64_t pixels);

  // For forward calls (`for_forward`) or for the gradients: the one transformed kernel that
  // use needs is made here, and the weight itself is not kept (a loop's [w_ih | w_hh] is a
  // copy that would otherwise live as long as this object).
  WinogradConv(const at::Tensor& weight, bool for_forward);

  at::Tensor forward(const at::Tensor& input, const std::optional<at::Tensor>& bias) const;  // [N, O, H, W]
  at::Tensor input_grad(const at::Tensor& grad_out) const;                                 // [N, I, H, W]
  // dL/dw [O, I, r, r], contiguous, in the input's dtype.
  at::Tensor weight_grad(const at::Tensor& grad_out, const at::Tensor& input) const;

 private:
  int64_t O_, I_;
  int r_;
  at::ScalarType dtype_;
  bool for_forward_;
  // Forward: G w Gᵀ [n·n, I, O]; gradients: the same of the rotated kernel w' [n·n, O, I]. float32
  // keeps each point packed for csrc/cpu/packed_gemm.h (winograd.cpp: transform_kernel).
  at::Tensor u_;
};

}  // namespace seqkernels::cpu
