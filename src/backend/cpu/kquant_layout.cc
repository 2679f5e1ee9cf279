#include "backend/cpu/kquant_layout.h"

#include "core/quant.h"

namespace blend::cpu::kquant {

bool kept_type(DType t) {
  return t == DType::kQ4_K || t == DType::kQ6_K || t == DType::kQ5_0 || t == DType::kQ8_0;
}

void decode_row(DType t, const std::byte* row, int64_t k, DecodedRow& out) {
  out.levels.resize(static_cast<size_t>(k));
  uint8_t* q = out.levels.data();
  const auto* b = reinterpret_cast<const uint8_t*>(row);
  if (t == DType::kQ4_K) {
    out.sc.resize(static_cast<size_t>(k / 32));
    out.mn.resize(static_cast<size_t>(k / 32));
    out.d.resize(static_cast<size_t>(k / kSuper));
    out.dmin.resize(static_cast<size_t>(k / kSuper));
    for (int64_t sb = 0; sb < k / kSuper; ++sb, b += 144) {
      out.d[static_cast<size_t>(sb)] = half_bits(b);
      out.dmin[static_cast<size_t>(sb)] = half_bits(b + 2);
      for (int j = 0; j < 8; ++j)
        unpack_q4_k_scale_min(j, b + 4, out.sc[static_cast<size_t>(sb * 8 + j)],
                              out.mn[static_cast<size_t>(sb * 8 + j)]);
      // Each 32 bytes of qs: sub-block 2p in the low nibbles, 2p + 1 in the high ones.
      for (int p = 0; p < 4; ++p)
        for (int l = 0; l < 32; ++l) {
          const uint8_t byte = b[16 + p * 32 + l];
          q[sb * kSuper + p * 64 + l] = byte & 0xF;
          q[sb * kSuper + p * 64 + 32 + l] = byte >> 4;
        }
    }
    return;
  }
  if (t == DType::kQ6_K) {
    out.sc.resize(static_cast<size_t>(k / kSub16));
    out.d.resize(static_cast<size_t>(k / kSuper));
    for (int64_t sb = 0; sb < k / kSuper; ++sb, b += 210) {
      out.d[static_cast<size_t>(sb)] = half_bits(b + 208);
      std::memcpy(out.sc.data() + sb * 16, b + 192, 16);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b + h * 64;
        const uint8_t* qh = b + 128 + h * 32;
        uint8_t* y = q + sb * kSuper + h * 128;
        for (int l = 0; l < 32; ++l) {
          y[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
          y[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
          y[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
          y[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
      }
    }
    return;
  }
  out.scale.resize(static_cast<size_t>(k / kSub16));
  const bool q5 = t == DType::kQ5_0;
  out.offset_ratio = q5 ? 16 : 128;
  for (int64_t blk = 0; blk < k / 32; ++blk, b += q5 ? 22 : 34) {
    const float d = f16_to_f32(half_bits(b));
    out.scale[static_cast<size_t>(blk * 2)] = out.scale[static_cast<size_t>(blk * 2 + 1)] = d;
    if (q5) {
      uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      for (int j = 0; j < 16; ++j) {
        q[blk * 32 + j] = static_cast<uint8_t>((b[6 + j] & 0xF) | (((qh >> j) << 4) & 0x10));
        q[blk * 32 + 16 + j] = static_cast<uint8_t>((b[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10));
      }
    } else {
      for (int j = 0; j < 32; ++j)
        q[blk * 32 + j] =
            static_cast<uint8_t>(static_cast<int32_t>(static_cast<int8_t>(b[2 + j])) + 128);
    }
  }
}

// Writes lane `lane` of a group from its decoded row.
void pack_lane(KQuantFormat f, const DecodedRow& row, int64_t k, int64_t lane, uint8_t* out) {
  const uint8_t* q = row.levels.data();
  if (f == KQuantFormat::kQ4K) {
    for (int64_t sb = 0; sb < k / kSuper; ++sb) {
      uint8_t* s = out + sb * kQ4KSuperBytes;
      for (int64_t v = 0; v < kSuper; ++v) {
        const int64_t blk = v / 32, t = v % 32 / 8, e = v % 8;
        s[(blk * 4 + t) * 64 + lane * 4 + e % 4] |=
            static_cast<uint8_t>(q[sb * kSuper + v] << (e < 4 ? 0 : 4));
      }
      for (int64_t j = 0; j < 8; ++j) {
        s[2048 + j * kGroup + lane] = row.sc[static_cast<size_t>(sb * 8 + j)];
        s[2176 + j * kGroup + lane] = row.mn[static_cast<size_t>(sb * 8 + j)];
      }
      std::memcpy(s + 2304 + lane * 2, &row.d[static_cast<size_t>(sb)], 2);
      std::memcpy(s + 2336 + lane * 2, &row.dmin[static_cast<size_t>(sb)], 2);
    }
    return;
  }
  if (f == KQuantFormat::kQ6K) {
    for (int64_t sb = 0; sb < k / kSuper; ++sb) {
      uint8_t* s = out + sb * kQ6KSuperBytes;
      for (int64_t v = 0; v < kSuper; ++v) {
        const int64_t j = v / 16, c = v % 16 / 4, e = v % 4;
        const uint8_t level = q[sb * kSuper + v];
        uint8_t* sub = s + j * kQ6KSubBytes;
        sub[(c % 2) * 64 + lane * 4 + e] |= static_cast<uint8_t>((level & 0xF) << (c < 2 ? 0 : 4));
        sub[128 + lane * 4 + e] |= static_cast<uint8_t>((level >> 4) << (2 * c));
      }
      for (int64_t j = 0; j < 16; ++j)
        s[16 * kQ6KSubBytes + j * kGroup + lane] = row.sc[static_cast<size_t>(sb * 16 + j)];
      std::memcpy(s + 16 * kQ6KSubBytes + 256 + lane * 2, &row.d[static_cast<size_t>(sb)], 2);
    }
    return;
  }
  if (f == KQuantFormat::kQ50) {
    for (int64_t b = 0; b < k / 32; ++b) {
      uint8_t* s = out + b * kQ50BlockBytes;
      for (int64_t v = 0; v < 32; ++v) {
        const int64_t c = v / 4, e = v % 4;
        const uint8_t level = q[b * 32 + v];
        s[(c % 4) * 64 + lane * 4 + e] |= static_cast<uint8_t>((level & 0xF) << (c < 4 ? 0 : 4));
        s[256 + lane * 4 + e] |= static_cast<uint8_t>(((level >> 4) & 1) << c);
      }
      std::memcpy(s + 320 + lane * 4, &row.scale[static_cast<size_t>(b * 2)], 4);
    }
    return;
  }
  for (int64_t j = 0; j < k / kSub16; ++j) {
    uint8_t* s = out + j * kByteSubBytes;
    for (int64_t v = 0; v < kSub16; ++v) s[(v / 4) * 64 + lane * 4 + v % 4] = q[j * kSub16 + v];
    std::memcpy(s + 256 + lane * 4, &row.scale[static_cast<size_t>(j)], 4);
  }
}

int64_t group_bytes(KQuantFormat f, int64_t k) {
  switch (f) {
    case KQuantFormat::kQ4K:
      return k / kSuper * kQ4KSuperBytes;
    case KQuantFormat::kQ6K:
      return k / kSuper * kQ6KSuperBytes;
    case KQuantFormat::kQ50:
      return k / 32 * kQ50BlockBytes;
    case KQuantFormat::kBytes:
      break;
  }
  return k / kSub16 * kByteSubBytes;
}

}  // namespace blend::cpu::kquant
