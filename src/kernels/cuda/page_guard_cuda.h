// CUDA launchers of the paged wrappers' run-time page ids (kernels/page_guard.h; plain C++
// header). Throw flashinfer::Error(kCuda) when a launch fails.
#pragma once

#include "kernels/page_guard.h"

namespace flashinfer::kernels::cuda {

/// Copies the caller's ids into the plan's page area on `stream` (a block per request), an id
/// outside the cache as 0, and sets p.bad. Launched without PDL, so it sees every write the
/// stream made to the ids before it; the attention kernels after it read the area after
/// pdl_wait(). No host read, no allocation (a CUDA graph captures it).
void page_guard_copy(const PageGuardParams& p, void* stream);

/// After the attention kernels (and their merge): NaN in the rows of the requests p.bad marks.
void page_guard_nan_rows(const PageGuardParams& p, void* stream);

}  // namespace flashinfer::kernels::cuda
