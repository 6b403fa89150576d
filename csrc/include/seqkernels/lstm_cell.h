// LSTM cell math, written once for every backend (host and device inline).
//
// Gate order is nn.LSTM's: i (input), f (forget), g (cell candidate), o (output).
// `Math` supplies sigmoid and tanh for the value type `V` (float, double, or a backend's
// fast approximation); everything else here is plain arithmetic so that CPU loops
// auto-vectorise and CUDA inlines it into the pointwise kernels.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SK_HOST_DEVICE inline
#endif

namespace seqkernels {

template <class V>
struct LstmGates {
  V i, f, g, o;
};

// Forward of one hidden unit.
//   pre: gate pre-activations (x·W_ihᵀ + h·W_hhᵀ + b_ih + b_hh); c_prev: c_{t-1}
//   act: activated gates (saved for backward); c: c_t; m: o ⊙ tanh(c_t), which is h_t
//   without projection and the input of W_hr with it.
template <class Math, class V>
SK_HOST_DEVICE void lstm_cell_forward(const LstmGates<V>& pre, V c_prev, LstmGates<V>& act, V& c, V& m) {
  act.i = Math::sigmoid(pre.i);
  act.f = Math::sigmoid(pre.f);
  act.g = Math::tanh(pre.g);
  act.o = Math::sigmoid(pre.o);
  c = act.f * c_prev + act.i * act.g;
  m = act.o * Math::tanh(c);
}

// Backward of one hidden unit.
//   act: saved activated gates; c: c_t; c_prev: c_{t-1}
//   dm: dL/dm_t (dL/dh_t without projection, W_hr-backpropagated with it)
//   dc_next: dL/dc_t arriving from step t+1 (or from c_n)
//   dpre: dL/d(pre-activations); dc_prev: dL/dc_{t-1}; m: recomputed o ⊙ tanh(c_t) (the
//   projection's weight gradient needs it)
template <class Math, class V>
SK_HOST_DEVICE void lstm_cell_backward(const LstmGates<V>& act, V c, V c_prev, V dm, V dc_next,
                                       LstmGates<V>& dpre, V& dc_prev, V& m) {
  const V one = V{} + 1.0f;  // not V(1): V may be a SIMD vector type (the CPU's AVX-512 gate pass)
  const V tanh_c = Math::tanh(c);
  m = act.o * tanh_c;
  const V dc = dc_next + dm * act.o * (one - tanh_c * tanh_c);
  dpre.o = dm * tanh_c * act.o * (one - act.o);
  dpre.i = dc * act.g * act.i * (one - act.i);
  dpre.f = dc * c_prev * act.f * (one - act.f);
  dpre.g = dc * act.i * (one - act.g * act.g);
  dc_prev = dc * act.f;
}

}  // namespace seqkernels
