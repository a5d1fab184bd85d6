// Umbrella header: the whole public API.
#pragma once

#include "flashinfer/api_call.h"
#include "flashinfer/device.h"
#include "flashinfer/dlpack.h"
#include "flashinfer/dtype.h"
#include "flashinfer/error.h"
#include "flashinfer/float_formats.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/activation.h"
#include "flashinfer/ops/norm.h"
#include "flashinfer/ops/rope.h"
#include "flashinfer/stream.h"
#include "flashinfer/tensor.h"
#include "flashinfer/value.h"
#include "flashinfer/version.h"
