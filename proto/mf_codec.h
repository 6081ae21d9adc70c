/*
 * mf_codec — scalar encodings used inside map rows (DESIGN §5): fp16, bf16,
 * fp8 e4m3 (OCP "fn": no infinities, max 448), the 8-bit log-domain code and the
 * one-byte block mass. The row builder, the C reference kernels and the CUDA
 * kernels' checks all call these: they are the definition of each format.
 *
 * Error bounds (p ≥ 0 a probability, m the tile's maximum, stored per tile):
 *   FP16       round-to-nearest-even; relative error ≤ 2^-11 for normals.
 *   BF16       round-to-nearest-even; relative error ≤ 2^-8.
 *   FP8_E4M3   code of p·448/m, RNE, saturating: |p̂−p| ≤ 2^-4·p + 2^-10·m/448.
 *   U8_LOG     q = 0 ↔ 0, else p̂ = m·2^((q−255)/16):
 *              |p̂−p| ≤ 0.0219·p + m·2^-16.875 (half a log step, or the zero cutoff).
 *   mass byte  q = round(255·sqrt(mass)), masŝ = (q/255)^2:
 *              |masŝ−mass| ≤ sqrt(mass)/255 + 1/255^2 (for mass in [0, 1]).
 *
 * Thread safety: pure functions; any thread.
 */
#ifndef MF_CODEC_H
#define MF_CODEC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint16_t mf_f32_to_f16(float f);
float mf_f16_to_f32(uint16_t h);
uint16_t mf_f32_to_bf16(float f);
float mf_bf16_to_f32(uint16_t h);

/* Raw e4m3 (no scaling): saturates to ±448; NaN → 0x7f. */
uint8_t mf_f32_to_e4m3(float f);
float mf_e4m3_to_f32(uint8_t c);

/* Tile-scaled 8-bit codes for probabilities in [0, m]. m = tile max (> 0, or 0 for
 * an all-zero tile, which decodes to zeros). */
uint8_t mf_fp8_encode(float p, float m);
float mf_fp8_decode(uint8_t c, float m);
uint8_t mf_u8log_encode(float p, float m);
float mf_u8log_decode(uint8_t q, float m);

/* Block mass in [0, 1] as one byte (sqrt domain: resolution where masses are small). */
uint8_t mf_mass_encode(float mass);
float mf_mass_decode(uint8_t q);

#ifdef __cplusplus
}
#endif
#endif /* MF_CODEC_H */
