/* Language-model pieces: rotary position embedding and the in-place KV cache update. */
#ifndef CUVIL_LLM_H
#define CUVIL_LLM_H
#include "common.h"

/* x, y: [B, T, H, D] (y may alias x); rotate halves (HF convention) by pos[b, t] * inv_freq[D/2]. */
void cuvil_rope(int64_t B, int64_t T, int64_t H, int64_t D, const float *x, const int64_t *pos,
                const float *inv_freq, float attn_scale, float *y, int nthreads);
/* Nonzero unless each row's slot is in [0, Bmax) (slots NULL: row b in slot b, so B <= Bmax) and rows
 * of one slot write positions apart ([start, start + T) disjoint): a step may carry several rows of
 * one sequence, each a token of its prompt beside other sequences' decode rows (continuous batching),
 * each reading the keys and values the step's rows before it wrote. */
int cuvil_check_slots(int64_t B, int64_t Bmax, int64_t T, const int64_t *start, const int64_t *slots);
/* cache: one layer, [Bmax, Hk, S, D] of floats, or of IEEE halves where half is nonzero (an fp16 KV
 * cache: new rows rounded to nearest even); new_: [B, T, Hk, D], row b written into slot slots[b]
 * (NULL: b) at rows start[b] .. start[b] + T. Returns nonzero (writing nothing) when a sequence would
 * run past S or the rows fail cuvil_check_slots. */
int cuvil_kv_update(int64_t B, int64_t Bmax, int64_t T, int64_t Hk, int64_t S, int64_t D, const float *new_,
                    const int64_t *start, const int64_t *slots, void *cache, int half);
#endif
