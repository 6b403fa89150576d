// ConvLSTM cell math for one (b, c, y, x) element, written once for every backend (host and
// device inline). Without peepholes it is exactly the LSTM cell of lstm_cell.h; with them,
// as in Shi et al. (2015): i and f also see c_{t-1}, o sees c_t, through Hadamard weights.
//   pre: gate pre-activations (w_ih * x_t + w_hh * h_{t-1} + bias) in order i, f, g, o
//   peep: the element's peephole weights (w_ci, w_cf, w_co); ignored without peepholes
#pragma once

#include "seqkernels/lstm_cell.h"

namespace seqkernels {

template <class V>
struct Peephole {
  V ci, cf, co;
};

// act: activated gates (saved for backward); c: c_t; h: h_t = o ⊙ tanh(c_t).
template <bool kPeephole, class Math, class V>
SK_HOST_DEVICE void convlstm_cell_forward(const LstmGates<V>& pre, V c_prev, const Peephole<V>& peep,
                                          LstmGates<V>& act, V& c, V& h) {
  if constexpr (!kPeephole) {
    lstm_cell_forward<Math>(pre, c_prev, act, c, h);
  } else {
    act.i = Math::sigmoid(pre.i + peep.ci * c_prev);
    act.f = Math::sigmoid(pre.f + peep.cf * c_prev);
    act.g = Math::tanh(pre.g);
    c = act.f * c_prev + act.i * act.g;
    act.o = Math::sigmoid(pre.o + peep.co * c);
    h = act.o * Math::tanh(c);
  }
}

// dh: dL/dh_t (from y_t and from step t+1); dc_next: dL/dc_t from step t+1 (or c_n).
// dpre: dL/d(pre-activations); dc_prev: dL/dc_{t-1}. The peephole weights' gradients are
// sums of dpre.i * c_prev, dpre.f * c_prev and dpre.o * c over batch and time, taken after
// the loop.
template <bool kPeephole, class Math, class V>
SK_HOST_DEVICE void convlstm_cell_backward(const LstmGates<V>& act, V c, V c_prev, const Peephole<V>& peep, V dh,
                                           V dc_next, LstmGates<V>& dpre, V& dc_prev) {
  if constexpr (!kPeephole) {
    V h_unused;
    lstm_cell_backward<Math>(act, c, c_prev, dh, dc_next, dpre, dc_prev, h_unused);
  } else {
    const V one(1);
    const V tanh_c = Math::tanh(c);
    dpre.o = dh * tanh_c * act.o * (one - act.o);
    const V dc = dc_next + dh * act.o * (one - tanh_c * tanh_c) + dpre.o * peep.co;
    dpre.i = dc * act.g * act.i * (one - act.i);
    dpre.f = dc * c_prev * act.f * (one - act.f);
    dpre.g = dc * act.i * (one - act.g * act.g);
    dc_prev = dc * act.f + dpre.i * peep.ci + dpre.f * peep.cf;
  }
}

}  // namespace seqkernels
