/*
 * calibrate_out — the sufficient statistics of calibrate.c's OUTPUTS objective
 * (calibrate.h, MF_CALIB_OUTPUTS). Internal to the calibration module: mf_calib_t owns one.
 *
 * Prob mode changes a head's output O = P·V (V the target's own), so the output objective
 * fits, per target layer t, source layer l and target head h with kv head g = h / (Ht/Hkv),
 *     min_w Σ_q ‖(A_t[h,q,:] − Σ_s w_s A_l[s,q,:]) · V_t[g]‖²,   w on the simplex,
 * from, summed over sequences (fixed size, whatever the sample count):
 *     gram[t][l][g][s][s'] = Σ_q ⟨O_s[q], O_s'[q]⟩   with O_s = A_l[s]·V_t[g]
 *     cross[t][l][h][s]    = Σ_q ⟨O_s[q], O_t[q]⟩     with O_t = A_t[h]·V_t[g]
 *     norm[t][l][h]        = Σ_q ‖O_t[q]‖²            (the residual's constant)
 *     cnorm[t][l][h]       = Σ_q ‖O_t[q] − mean_q O_t‖² per sequence (the error's scale)
 * Each (t, l) pair keeps its own norms and sequence count, so a pair is consistent on its
 * own whichever pairs a caller fed. Thread safety: the owning mf_calib_t's thread only.
 */
#ifndef MF_CALIBRATE_OUT_H
#define MF_CALIBRATE_OUT_H

#include <stdint.h>

#include "mf_status.h"

/* Bounds of the output statistics (bad arguments beyond them: MF_INVALID_ARGUMENT). */
#define MF_CALIB_MAX_HEAD_DIM 1024u
#define MF_CALIB_MAX_OUT_STATS (1ull << 27) /* doubles in gram (1 GiB) */

typedef struct mf_calib_out {
    uint32_t ls, hs, lt, ht, hkv, d;
    double *gram;      /* [lt][ls][hkv][hs][hs] */
    double *cross;     /* [lt][ls][ht][hs] */
    double *norm;      /* [lt][ls][ht] */
    double *cnorm;     /* [lt][ls][ht] */
    uint64_t *count;   /* [lt][ls] sequences added */
} mf_calib_out_t;

mf_status_t mf_calib_out_create(uint32_t ls, uint32_t hs, uint32_t lt, uint32_t ht,
                                uint32_t hkv, uint32_t d, mf_calib_out_t **out);
void mf_calib_out_destroy(mf_calib_out_t *o);

/* One sequence of pair (t, l): o_src [Hkv, Hs, N, d] = A_l[s]·V_t[g], o_tgt [Ht, N, d]. */
mf_status_t mf_calib_out_add(mf_calib_out_t *o, uint32_t t, uint32_t l, const float *o_src,
                             const float *o_tgt, uint32_t n);

/* One sequence of every pair from the maps src [Ls, Hs, N, N], tgt [Lt, Ht, N, N] and the
 * target's values v [Lt, Hkv, N, d] (the products computed here, causal part only). */
mf_status_t mf_calib_out_add_v(mf_calib_out_t *o, const float *src, const float *tgt,
                               const float *v, uint32_t n);

#endif /* MF_CALIBRATE_OUT_H */
