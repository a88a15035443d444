// Pass fuse-row-kernels: a row kernel and the elementwise loop next to it become one kernel that
// finishes each row while it is in L1: layer_norm followed by its gain and bias (`y * gain +
// bias` along the row) becomes layerNormAffine, and a mask loop (`where(mask, x, fill)`) followed
// by a softmax of its result becomes maskedSoftmax, and a loop of products `a * b` summed along
// the row by the reduce after it (the softmax's gradient's sum(dy * y), the loss's
// sum(logp * one_hot)) becomes reduceProduct, which never stores the products. Only for dense
// rows of one unsplit lane, when
// nothing else reads the value between the two. Then a loop that sums two or three rows (the
// residual add) right before such a layerNormAffine of the sum becomes addLayerNormAffine, which
// stores the sum as well and normalizes each row while it is in L1.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void fuseRowKernels(KernelFunction& function);

} // namespace meshc::kir
