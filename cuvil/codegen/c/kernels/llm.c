#include "llm.h"

void cuvil_rope(int64_t B, int64_t T, int64_t H, int64_t D, const float *x, const int64_t *pos,
                const float *inv_freq, float attn_scale, float *y, int nthreads) {
    int64_t half = D / 2;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (B * T * H * D > 32768)
    for (int64_t bt = 0; bt < B * T; bt++) {
        float c[half > 0 ? half : 1], s[half > 0 ? half : 1];
        double p = (double)pos[bt];
        for (int64_t i = 0; i < half; i++) {
            double a = p * (double)inv_freq[i];
            c[i] = (float)cos(a) * attn_scale;
            s[i] = (float)sin(a) * attn_scale;
        }
        for (int64_t h = 0; h < H; h++) {
            const float *xr = x + (bt * H + h) * D;
            float *yr = y + (bt * H + h) * D;
            for (int64_t i = 0; i < half; i++) {
                float x1 = xr[i], x2 = xr[i + half];
                yr[i] = x1 * c[i] - x2 * s[i];
                yr[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

int cuvil_kv_update(int64_t B, int64_t Bmax, int64_t T, int64_t Hk, int64_t S, int64_t D, const float *new_,
                    const int64_t *start, float *cache) {
    if (B > Bmax) return 1;
    for (int64_t b = 0; b < B; b++)
        if (start[b] < 0 || start[b] + T > S) return 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < Hk; h++)
                memcpy(cache + ((b * Hk + h) * S + start[b] + t) * D, new_ + ((b * T + t) * Hk + h) * D,
                       (size_t)D * sizeof(float));
    return 0;
}
