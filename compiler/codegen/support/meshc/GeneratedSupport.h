// Support code for the C++ that `meshc --emit=cpp` generates: local shard buffers, strided
// loops, einsum through OpenBLAS, reductions, the "along a dim" ops (softmax, layer_norm,
// cumsum, shift) with their in-op collectives when the dim is split, data movement, the
// layout-invariant RNG fills, and the pack/unpack around meshrt's chunked collectives.
//
// Value representation: every tensor is row-major floats over its LOCAL shape. Inputs, outputs
// and parameters own a std::vector<float>; run()'s temporaries are views (std::span) of slots of
// the class's Arena, at byte offsets the generator assigns by liveness.
// Float dtypes hold values already rounded to their dtype (bf16/f16 re-rounded after every op,
// as the reference interpreter does); i32 values are held as exact integers in float (exact up
// to 2^24, enough for ids, positions and masks).
//
// Header-only on purpose: generated code includes it next to meshrt's headers; it needs meshrt
// (Comm.h, Random.h), meshrt_kernels (f32 einsums go through meshrt::kernels::EinsumPlan) and
// cblas. einsum2 (SupportEinsum.h) is the local GEMM path kept for the narrow-dtype variant and as
// a checked fallback.
//
// In five parts, each including the one before it: SupportCore.h (buffers, scalars, f32 math,
// strided loops), SupportShards.h (shards, RNG fills, params), SupportEinsum.h, SupportRows.h
// (reductions, ops along a dim; SupportNormGrad.h, layer_norm's gradient, beside it) and
// SupportMovement.h (data movement, collectives over a dim, output files, stage sends).
#pragma once

#include "meshc/SupportCore.h"
#include "meshc/SupportEinsum.h"
#include "meshc/SupportMovement.h"
#include "meshc/SupportNormGrad.h"
#include "meshc/SupportRows.h"
#include "meshc/SupportShards.h"
