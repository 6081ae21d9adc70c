/*
 * mf_profile — mapping profiles (DESIGN §6) on disk: the protobuf message
 * Mapflow__V1__MappingProfile, serialized as is to a file. Load, validate, save, look up
 * a target layer, and turn a layer's entry into the plain arrays mf_apply_ref takes.
 *
 * Validation (every load and decode): block size a power of two in [8, 256]; at most
 * 4096 layers, strictly rising target layers ≥ l0 (and < target_layers when that is
 * set); 1..64 heads each side; W has Ht × Hs finite, non-negative weights whose rows
 * sum to 1 within 1e-3; one HeadProfile per target head with a known mode, error ≥ 0
 * and top_p in [0, 1] (0 = 1.0). Files over 64 MiB are refused before reading.
 *
 * mf_profile_export_plan turns a profile into what a source must export for it: per
 * mapped source layer, mask rows or prob rows (issue 20: rows cost ∝ N² only where a
 * target head reads tiles).
 *
 * Ownership: a loaded/decoded profile belongs to the caller, freed by mf_profile_free
 * (protobuf-c's free_unpacked). Profiles a caller builds by hand are the caller's to
 * free; mf_profile_save only reads them. Thread safety: no global state; any thread.
 */
#ifndef MF_PROFILE_H
#define MF_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "mapflow.pb-c.h"
#include "mapflow_kernels.h"
#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_PROFILE_MAX_BYTES  (64u << 20)
#define MF_PROFILE_MAX_LAYERS 4096u

/* Load + validate. MF_NOT_FOUND (no file), MF_INVALID_ARGUMENT (malformed / invalid). */
mf_status_t mf_profile_load(const char *path, Mapflow__V1__MappingProfile **profile);
/* The same with a message ("PATH: W row 3 of layer 5 sums to 0.8") in err. */
mf_status_t mf_profile_read(const char *path, Mapflow__V1__MappingProfile **profile,
                            char *err, size_t errlen);
/* Unpack + validate serialized bytes (e.g. from a ProfileGetReply payload). */
mf_status_t mf_profile_decode(const void *buf, size_t len,
                              Mapflow__V1__MappingProfile **profile, const char **why);
void mf_profile_free(Mapflow__V1__MappingProfile *profile);

mf_status_t mf_profile_validate(const Mapflow__V1__MappingProfile *p, const char **why);

/* Validate, serialize and write atomically (PATH.tmp, fsync, rename). */
mf_status_t mf_profile_save(const char *path, const Mapflow__V1__MappingProfile *p);

/* The entry for target layer t, or NULL when t is computed (t < l0 or not listed). */
const Mapflow__V1__LayerMap *mf_profile_layer(const Mapflow__V1__MappingProfile *p,
                                              uint32_t target_layer);

/*
 * Plain-array view of a layer entry for mf_apply_ref: out->w points into lm (valid while
 * lm is); modes go to mode_buf [Ht], Top-P to top_p_buf [Ht] (0 becomes 1.0).
 */
mf_status_t mf_layer_map_from_proto(const Mapflow__V1__LayerMap *lm, mf_layer_map_t *out,
                                    uint8_t *mode_buf, float *top_p_buf);

/* One source layer a source exports, and the codec its rows need. */
typedef struct mf_export_layer {
    uint32_t source_layer;
    mf_codec_t codec;
} mf_export_layer_t;

/*
 * The export plan of a (valid) profile, sorted by source layer, each layer once: a source
 * layer some LayerMap reads gets prob_codec when any of those maps has a head in PROB mode
 * (its W row, summing to 1, reads that layer), else MF_CODEC_MASK when one has a head in
 * MASK mode; a layer whose readers are all COMPUTE heads needs no rows and is left out.
 * prob_codec must carry tiles (not MF_CODEC_MASK). *n = the plan's length; more than cap
 * layers: MF_RESOURCE_EXHAUSTED (out holds cap of them, *n = 0). MF_INVALID_ARGUMENT
 * (message in *why, which may be NULL) for an invalid profile, codec or null argument.
 */
mf_status_t mf_profile_export_plan(const Mapflow__V1__MappingProfile *p, mf_codec_t prob_codec,
                                   mf_export_layer_t *out, uint32_t cap, uint32_t *n,
                                   const char **why);

#ifdef __cplusplus
}
#endif
#endif /* MF_PROFILE_H */
