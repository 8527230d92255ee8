#include "linalg.h"

#include <math.h>
#include <string.h>

void cuvil_lu_factor(int64_t batch, int64_t m, int64_t n, const float *a, float *lu, int32_t *piv, int32_t *info) {
    const int64_t k = m < n ? m : n;
    for (int64_t b = 0; b < batch; b++) {
        float *A = lu + b * m * n;
        int32_t *p = piv + b * k;
        if (A != a + b * m * n) memcpy(A, a + b * m * n, sizeof(float) * m * n);
        info[b] = 0;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = j;                    /* the first of equal magnitudes, as isamax */
            for (int64_t i = j + 1; i < m; i++)
                if (fabsf(A[i * n + j]) > fabsf(A[best * n + j])) best = i;
            p[j] = (int32_t)(best + 1);
            if (A[best * n + j] != 0.f) {
                if (best != j)
                    for (int64_t c = 0; c < n; c++) {
                        float t = A[j * n + c];
                        A[j * n + c] = A[best * n + c];
                        A[best * n + c] = t;
                    }
                float r = 1.f / A[j * n + j];
                for (int64_t i = j + 1; i < m; i++) A[i * n + j] *= r;
            } else if (!info[b]) {
                info[b] = (int32_t)(j + 1);
            }
            for (int64_t i = j + 1; i < m; i++) {
                float l = A[i * n + j];
                for (int64_t c = j + 1; c < n; c++) A[i * n + c] -= l * A[j * n + c];
            }
        }
    }
}

void cuvil_lu_permutation(int64_t batch, int64_t k, int64_t m, const int32_t *piv, int64_t *perm) {
    for (int64_t b = 0; b < batch; b++) {
        int64_t *P = perm + b * m;
        for (int64_t i = 0; i < m; i++) P[i] = i;
        for (int64_t j = 0; j < k && j < m; j++) {
            int64_t q = (int64_t)piv[b * k + j] - 1;
            q = q < 0 ? 0 : q >= m ? m - 1 : q;
            int64_t t = P[j];
            P[j] = P[q];
            P[q] = t;
        }
    }
}

void cuvil_cholesky(int64_t batch, int64_t n, const float *a, float *l, int32_t *info) {
    for (int64_t b = 0; b < batch; b++) {
        const float *A = a + b * n * n;
        float *L = l + b * n * n;
        info[b] = 0;
        for (int64_t j = 0; j < n; j++) {
            double d = A[j * n + j];
            for (int64_t c = 0; c < j; c++) d -= (double)L[j * n + c] * L[j * n + c];
            if (!(d > 0) && !info[b]) info[b] = (int32_t)(j + 1);
            double root = sqrt(d);
            L[j * n + j] = (float)root;
            for (int64_t c = j + 1; c < n; c++) L[j * n + c] = 0.f;
            for (int64_t i = j + 1; i < n; i++) {
                double s = A[i * n + j];
                for (int64_t c = 0; c < j; c++) s -= (double)L[i * n + c] * L[j * n + c];
                L[i * n + j] = (float)(s / root);
            }
        }
    }
}

void cuvil_triangular_solve(int64_t batch, int64_t n, int64_t k, const float *a, const float *b, float *x,
                            int upper, int unit) {
    for (int64_t bt = 0; bt < batch; bt++) {
        const float *A = a + bt * n * n, *B = b + bt * n * k;
        float *X = x + bt * n * k;
        for (int64_t step = 0; step < n; step++) {
            int64_t i = upper ? n - 1 - step : step, j0 = upper ? i + 1 : 0, j1 = upper ? n : i;
            for (int64_t c = 0; c < k; c++) {
                double s = B[i * k + c];
                for (int64_t j = j0; j < j1; j++) s -= (double)A[i * n + j] * X[j * k + c];
                X[i * k + c] = (float)(unit ? s : s / A[i * n + i]);
            }
        }
    }
}

void cuvil_householder_qr(int64_t batch, int64_t m, int64_t n, const float *a, float *qr, float *tau) {
    const int64_t k = m < n ? m : n;
    for (int64_t b = 0; b < batch; b++) {
        float *A = qr + b * m * n, *t = tau + b * k;
        if (A != a + b * m * n) memcpy(A, a + b * m * n, sizeof(float) * m * n);
        for (int64_t j = 0; j < k; j++) {
            double alpha = A[j * n + j], norm2 = 0;
            for (int64_t i = j + 1; i < m; i++) norm2 += (double)A[i * n + j] * A[i * n + j];
            if (norm2 == 0) {                    /* nothing below the diagonal: H = I, as slarfg */
                t[j] = 0.f;
                continue;
            }
            double beta = -copysign(sqrt(alpha * alpha + norm2), alpha), tj = (beta - alpha) / beta;
            double scale = 1 / (alpha - beta);
            for (int64_t i = j + 1; i < m; i++) A[i * n + j] = (float)(A[i * n + j] * scale);
            A[j * n + j] = (float)beta;
            t[j] = (float)tj;
            for (int64_t c = j + 1; c < n; c++) {            /* the trailing columns times H = I - tau v v^T */
                double w = A[j * n + c];
                for (int64_t i = j + 1; i < m; i++) w += (double)A[i * n + j] * A[i * n + c];
                w *= tj;
                A[j * n + c] = (float)(A[j * n + c] - w);
                for (int64_t i = j + 1; i < m; i++) A[i * n + c] = (float)(A[i * n + c] - w * A[i * n + j]);
            }
        }
    }
}

void cuvil_householder_product(int64_t batch, int64_t m, int64_t n, int64_t k, const float *v, const float *tau,
                               float *q) {
    for (int64_t b = 0; b < batch; b++) {
        const float *V = v + b * m * n, *t = tau + b * k;
        float *Q = q + b * m * n;
        for (int64_t i = 0; i < m; i++)
            for (int64_t c = 0; c < n; c++) Q[i * n + c] = i == c ? 1.f : 0.f;
        for (int64_t j = (k < n ? k : n) - 1; j >= 0; j--) {    /* Q = H_0 (H_1 (... (H_{k-1} I))) */
            double tj = t[j];
            for (int64_t c = 0; c < n; c++) {
                double w = Q[j * n + c];
                for (int64_t i = j + 1; i < m; i++) w += (double)V[i * n + j] * Q[i * n + c];
                w *= tj;
                Q[j * n + c] = (float)(Q[j * n + c] - w);
                for (int64_t i = j + 1; i < m; i++) Q[i * n + c] = (float)(Q[i * n + c] - w * V[i * n + j]);
            }
        }
    }
}
