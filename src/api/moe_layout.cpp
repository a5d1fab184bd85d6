#include "api/moe_layout.h"

#include <cstring>

#include "api/checks.h"
#include "flashinfer/error.h"

namespace flashinfer::api {

int64_t moe_shuffle_block_size(int64_t epilogue_tile_m) {
  return epilogue_tile_m % 128 == 0 ? 32 : 16;
}

std::vector<int64_t> moe_shuffled_row_source(int64_t m, int64_t epilogue_tile_m,
                                             bool gated_interleave) {
  const int64_t b = moe_shuffle_block_size(epilogue_tile_m);
  const int64_t lanes = b / 8;  // srcToDstBlk{16,32}RowMap: row r of a block goes to
                                // (r % lanes) * 8 + r / lanes
  std::vector<int64_t> src(static_cast<size_t>(m));
  for (int64_t old_row = 0; old_row < m; ++old_row) {
    const int64_t blk = old_row / b, r = old_row % b;
    const int64_t new_row = blk * b + (r % lanes) * 8 + r / lanes;
    // The interleave is applied first (its output is what gets shuffled).
    const int64_t plain =
        gated_interleave ? (old_row % 2 == 0 ? old_row / 2 : m / 2 + old_row / 2) : old_row;
    src[static_cast<size_t>(new_row)] = plain;
  }
  return src;
}

int64_t moe_check_weights(const Tensor& w, int64_t E, int64_t mn, int64_t k,
                          const MoeWeightFormat& f, const char* op, const char* arg) {
  FLASHINFER_CHECK_CODE(
      f.layout != WeightLayout::MajorMn, ErrorCode::kUnsupported, op, "weight_layout",
      "WeightLayout.MajorMn is not supported (upstream's trtllm launcher refuses it "
      "too)");
  FLASHINFER_CHECK(w.is_contiguous(), op, arg, "must be contiguous");
  int64_t bk = 0;
  if (f.layout == WeightLayout::MajorK) {
    FLASHINFER_CHECK(w.shape() == Shape({E, mn, k}), op, arg, "expected [", E, ", ", mn, ", ", k,
                     "] (MajorK), got ", shape_to_string(w.shape()));
  } else {
    FLASHINFER_CHECK(w.dim() == 4 && w.size(0) == E && w.size(2) == mn && w.size(3) >= 1 &&
                         k % w.size(3) == 0 && w.size(1) == k / w.size(3),
                     op, arg, "expected [", E, ", ", k, " / block_k, ", mn,
                     ", block_k] (BlockMajorK), got ", shape_to_string(w.shape()));
    bk = w.size(3);
  }
  if (f.shuffled) {
    const int64_t b = moe_shuffle_block_size(f.epilogue_tile_m);
    FLASHINFER_CHECK(mn % b == 0 && (!f.gated_interleave || mn % 2 == 0), op, arg,
                     "shuffled weights need a row count that is a multiple of ", b, ", got ", mn);
  }
  return bk;
}

kernels::MoeWeightIndex moe_stored_weight_index(const Tensor& w, int64_t E, int64_t mn, int64_t k,
                                                const MoeWeightFormat& f, const char* op,
                                                const char* arg) {
  kernels::MoeWeightIndex ix;
  ix.block_k = moe_check_weights(w, E, mn, k, f, op, arg);
  ix.shuffled = f.shuffled;
  ix.gated_interleave = f.gated_interleave;
  ix.shuffle_block = moe_shuffle_block_size(f.epilogue_tile_m);
  return ix;
}

Tensor moe_plain_weights(const Tensor& w, int64_t E, int64_t mn, int64_t k,
                         const MoeWeightFormat& f, const char* op, const char* arg) {
  const kernels::MoeWeightIndex ix = moe_stored_weight_index(w, E, mn, k, f, op, arg);
  if (!f.shuffled && f.layout == WeightLayout::MajorK) return w;
  // The CUDA kernels read the stored layout in place (kernels/moe_layout_rules.h); only the ops
  // without a CUDA kernel get here with a device tensor.
  FLASHINFER_CHECK_CODE(
      w.device().is_cpu(), ErrorCode::kUnsupported, op, arg,
      "shuffled / BlockMajorK weights are turned back into plain rows on the host only");
  Tensor out = Tensor::empty({E, mn, k}, w.dtype(), w.device());
  const size_t es = w.element_size();
  const auto* in = static_cast<const uint8_t*>(w.data_ptr());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  // Plain row j gathers its runs of block_k (BlockMajorK) or k (MajorK) contiguous elements
  // through the index the CUDA kernels read with.
  const int64_t run = ix.block_k == 0 ? k : ix.block_k;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t j = 0; j < mn; ++j) {
      const int64_t row = kernels::moe_stored_row(ix, mn, j);
      uint8_t* dst = o + static_cast<size_t>((e * mn + j) * k) * es;
      for (int64_t c = 0; c < k; c += run) {
        const int64_t src = kernels::moe_weight_offset(ix, mn, k, e, row, c);
        std::memcpy(dst + static_cast<size_t>(c) * es, in + static_cast<size_t>(src) * es,
                    static_cast<size_t>(run) * es);
      }
    }
  }
  return out;
}

Tensor moe_plain_bias(const Tensor& b, int64_t E, int64_t m, bool shuffled, int64_t epilogue_tile_m,
                      bool gated_interleave) {
  const Tensor c = b.to(Device::cpu()).contiguous();
  if (!shuffled) return c;
  const std::vector<int64_t> src = moe_shuffled_row_source(m, epilogue_tile_m, gated_interleave);
  Tensor out = Tensor::empty({E, m}, DType::kFloat32, Device::cpu());
  const float* in = c.data<float>();
  float* o = out.data<float>();
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < m; ++r) o[e * m + src[static_cast<size_t>(r)]] = in[e * m + r];
  }
  return out;
}

std::vector<int64_t> moe_valid_rows(int64_t I, int64_t iv, bool gated) {
  std::vector<int64_t> rows;
  for (int64_t j = 0; j < iv; ++j) rows.push_back(j);
  for (int64_t j = 0; gated && j < iv; ++j) rows.push_back(I + j);
  return rows;
}

Tensor moe_keep_rows_cols(const Tensor& t, const std::vector<int64_t>& rows, int64_t cols) {
  const Tensor src = t.contiguous();
  const bool vec = src.dim() == 2;
  const int64_t E = src.size(0), R = src.size(1), C = vec ? 1 : src.size(2);
  const int64_t kc = vec ? 1 : cols, kr = rows.empty() ? R : static_cast<int64_t>(rows.size());
  Tensor out = vec ? Tensor::empty({E, kr}, src.dtype(), Device::cpu())
                   : Tensor::empty({E, kr, kc}, src.dtype(), Device::cpu());
  const size_t es = src.element_size();
  const auto* in = static_cast<const uint8_t*>(src.data_ptr());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < kr; ++r) {
      const int64_t sr = rows.empty() ? r : rows[static_cast<size_t>(r)];
      std::memcpy(o + static_cast<size_t>((e * kr + r) * kc) * es,
                  in + static_cast<size_t>((e * R + sr) * C) * es, static_cast<size_t>(kc) * es);
    }
  }
  return out;
}

}  // namespace flashinfer::api
