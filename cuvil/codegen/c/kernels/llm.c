#include "llm.h"
#include "half.h"
#include "pool.h"

typedef struct { int64_t H, D; const float *x; const int64_t *pos; const float *inv_freq; float scale; float *y; } rope_args;

static void rope_task(void *ctx, int64_t bt0, int64_t bt1) {
    const rope_args *a = ctx;
    int64_t half = a->D / 2;
    for (int64_t bt = bt0; bt < bt1; bt++) {
        float c[half > 0 ? half : 1], s[half > 0 ? half : 1];
        double p = (double)a->pos[bt];
        for (int64_t i = 0; i < half; i++) {
            double ang = p * (double)a->inv_freq[i];
            c[i] = (float)cos(ang) * a->scale;
            s[i] = (float)sin(ang) * a->scale;
        }
        for (int64_t h = 0; h < a->H; h++) {
            const float *xr = a->x + (bt * a->H + h) * a->D;
            float *yr = a->y + (bt * a->H + h) * a->D;
            for (int64_t i = 0; i < half; i++) {
                float x1 = xr[i], x2 = xr[i + half];
                yr[i] = x1 * c[i] - x2 * s[i];
                yr[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

void cuvil_rope(int64_t B, int64_t T, int64_t H, int64_t D, const float *x, const int64_t *pos,
                const float *inv_freq, float attn_scale, float *y, int nthreads) {
    rope_args a = {H, D, x, pos, inv_freq, attn_scale, y};
    cuvil_parallel_for(B * T * H * D > 32768 ? nthreads : 1, B * T, 1, rope_task, &a);
}

int cuvil_check_slots(int64_t B, int64_t Bmax, int64_t T, const int64_t *start, const int64_t *slots) {
    if (!slots) return B > Bmax;
    for (int64_t b = 0; b < B; b++) {
        if (slots[b] < 0 || slots[b] >= Bmax) return 1;
        for (int64_t c = 0; c < b; c++)       /* two rows writing one position of one slot */
            if (slots[c] == slots[b] && start[c] < start[b] + T && start[b] < start[c] + T) return 1;
    }
    return 0;
}

int cuvil_kv_update(int64_t B, int64_t Bmax, int64_t T, int64_t Hk, int64_t S, int64_t D, const float *new_,
                    const int64_t *start, const int64_t *slots, void *cache, int half) {
    if (cuvil_check_slots(B, Bmax, T, start, slots)) return 1;
    for (int64_t b = 0; b < B; b++)
        if (start[b] < 0 || start[b] + T > S) return 1;
    for (int64_t b = 0; b < B; b++) {
        const int64_t slot = slots ? slots[b] : b;
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < Hk; h++) {
                const int64_t row = ((slot * Hk + h) * S + start[b] + t) * D;
                const float *src = new_ + ((b * T + t) * Hk + h) * D;
                if (!half) memcpy((float *)cache + row, src, (size_t)D * sizeof(float));
                else for (int64_t d = 0; d < D; d++) ((uint16_t *)cache)[row + d] = cuvil_f32_to_f16(src[d]);
            }
    }
    return 0;
}
