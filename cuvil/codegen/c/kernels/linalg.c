#include "linalg.h"

#include "pool.h"

#include <float.h>
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
                float pivot = A[j * n + j], r = 1.f / pivot;
                if (fabsf(pivot) >= FLT_MIN)        /* as sgetrf2: a subnormal pivot's reciprocal is inf */
                    for (int64_t i = j + 1; i < m; i++) A[i * n + j] *= r;
                else
                    for (int64_t i = j + 1; i < m; i++) A[i * n + j] /= pivot;
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

/* ---- symmetric eigenvalues and singular values by Jacobi rotations (in double, in a thread buffer) ---- */
#define JACOBI_SWEEPS 60

/* the rotation (c, s) that zeroes the (p, q) entry of a symmetric 2x2 [[app, apq], [apq, aqq]] */
static void jacobi_rotation(double app, double aqq, double apq, double *c, double *s) {
    double theta = (aqq - app) / (2 * apq);
    double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1));
    *c = 1 / sqrt(t * t + 1);
    *s = t * *c;
}

/* (x, y) <- (c x - s y, s x + c y) over n pairs x[k * stride], y[k * stride]: one Jacobi rotation of
 * two rows or two columns */
static void rotate(double *x, double *y, int64_t n, int64_t stride, double c, double s) {
    for (int64_t k = 0; k < n; k++) {
        double a = x[k * stride], b = y[k * stride];
        x[k * stride] = c * a - s * b;
        y[k * stride] = s * a + c * b;
    }
}

/* +1 or -1: the sign that makes the column's largest entry (the first of equal magnitudes) positive,
 * the vectors' convention (eigen- and singular vectors are defined up to sign); col[k * stride], k < n */
static double column_sign(const double *col, int64_t n, int64_t stride) {
    int64_t best = 0;
    for (int64_t k = 1; k < n; k++)
        if (fabs(col[k * stride]) > fabs(col[best * stride])) best = k;
    return n && col[best * stride] < 0 ? -1 : 1;
}

/* w [n] ascending and v [n][n] (columns the eigenvectors) of the symmetric A [n][n] (its lower triangle
 * read), by cyclic Jacobi on a double copy; work holds n * n + n * n doubles. */
static void eigh_one(int64_t n, const float *a, double *A, double *V, float *w, float *v) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            A[i * n + j] = i >= j ? a[i * n + j] : a[j * n + i];
            V[i * n + j] = i == j;
        }
    for (int sweep = 0; sweep < JACOBI_SWEEPS; sweep++) {
        double off = 0, diag = 0;
        for (int64_t i = 0; i < n; i++) {
            diag += A[i * n + i] * A[i * n + i];
            for (int64_t j = i + 1; j < n; j++) off += A[i * n + j] * A[i * n + j];
        }
        if (off <= 1e-30 * diag || off == 0) break;
        for (int64_t p = 0; p < n; p++)
            for (int64_t q = p + 1; q < n; q++) {
                if (A[p * n + q] == 0) continue;
                double c, s;
                jacobi_rotation(A[p * n + p], A[q * n + q], A[p * n + q], &c, &s);
                rotate(A + p, A + q, n, n, c, s);             /* A = J^T A J (columns, then rows), V = V J */
                rotate(A + p * n, A + q * n, n, 1, c, s);
                rotate(V + p, V + q, n, n, c, s);
            }
    }
    for (int64_t i = 0; i < n; i++) {                        /* ascending, by selection */
        int64_t best = i;
        for (int64_t j = i + 1; j < n; j++)
            if (A[j * n + j] < A[best * n + best]) best = j;
        double d = A[i * n + i];
        A[i * n + i] = A[best * n + best];
        A[best * n + best] = d;
        for (int64_t k = 0; k < n; k++) {
            double t = V[k * n + i];
            V[k * n + i] = V[k * n + best];
            V[k * n + best] = t;
        }
        w[i] = (float)A[i * n + i];
    }
    for (int64_t i = 0; i < n; i++) {
        double sign = column_sign(V + i, n, n);
        for (int64_t k = 0; k < n; k++) v[k * n + i] = (float)(sign * V[k * n + i]);
    }
}

void cuvil_eigh(int64_t batch, int64_t n, const float *a, float *w, float *v) {
    double *work = cuvil_thread_buffer(CUVIL_BUF_LINALG, sizeof(double) * 2 * (size_t)(n * n + 1));
    for (int64_t b = 0; b < batch; b++) {
        if (!work) {                                         /* out of memory: NaN, never a wrong number */
            for (int64_t i = 0; i < n; i++) w[b * n + i] = NAN;
            for (int64_t i = 0; i < n * n; i++) v[b * n * n + i] = NAN;
            continue;
        }
        eigh_one(n, a + b * n * n, work, work + n * n, w + b * n, v + b * n * n);
    }
}

/* Thin SVD by one-sided Jacobi (Hestenes): the columns of U = A (m >= n; a wide A is done transposed)
 * rotated until orthogonal, the rotations gathered in V; s their norms, descending. u [m][k], s [k],
 * vt [k][n], k = min(m, n). */
static void svd_tall(int64_t m, int64_t n, double *U, double *V, double *norms, float *u, float *s, float *vt,
                     int transposed, int64_t ld_u, int64_t ld_vt) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) V[i * n + j] = i == j;
    for (int sweep = 0; sweep < JACOBI_SWEEPS; sweep++) {
        int rotated = 0;
        for (int64_t p = 0; p < n; p++)
            for (int64_t q = p + 1; q < n; q++) {
                double alpha = 0, beta = 0, gamma = 0;
                for (int64_t k = 0; k < m; k++) {
                    alpha += U[k * n + p] * U[k * n + p];
                    beta += U[k * n + q] * U[k * n + q];
                    gamma += U[k * n + p] * U[k * n + q];
                }
                if (gamma == 0 || fabs(gamma) <= 1e-15 * sqrt(alpha * beta)) continue;
                rotated = 1;
                double c, sn;
                jacobi_rotation(alpha, beta, gamma, &c, &sn);
                rotate(U + p, U + q, m, n, c, sn);
                rotate(V + p, V + q, n, n, c, sn);
            }
        if (!rotated) break;
    }
    for (int64_t j = 0; j < n; j++) {
        double t = 0;
        for (int64_t k = 0; k < m; k++) t += U[k * n + j] * U[k * n + j];
        norms[j] = sqrt(t);
    }
    for (int64_t i = 0; i < n; i++) {                        /* descending, by selection: column i */
        int64_t j = i;
        for (int64_t c = i + 1; c < n; c++)
            if (norms[c] > norms[j]) j = c;
        if (j != i) {
            double t = norms[i];
            norms[i] = norms[j];
            norms[j] = t;
            for (int64_t k = 0; k < m; k++) {
                t = U[k * n + i];
                U[k * n + i] = U[k * n + j];
                U[k * n + j] = t;
            }
            for (int64_t k = 0; k < n; k++) {
                t = V[k * n + i];
                V[k * n + i] = V[k * n + j];
                V[k * n + j] = t;
            }
        }
        double inv = norms[i] > 0 ? column_sign(U + i, m, n) / norms[i] : 0, vsign = inv < 0 ? -1 : 1;
        s[i] = (float)norms[i];
        for (int64_t k = 0; k < m; k++) {                    /* A = U S V^T; transposed (A^T's): swapped */
            float uk = (float)(U[k * n + i] * inv);
            if (transposed) vt[i * ld_vt + k] = uk; else u[k * ld_u + i] = uk;
        }
        for (int64_t k = 0; k < n; k++) {
            float vk = (float)(vsign * V[k * n + i]);
            if (transposed) u[k * ld_u + i] = vk; else vt[i * ld_vt + k] = vk;
        }
    }
}

void cuvil_svd(int64_t batch, int64_t m, int64_t n, const float *a, float *u, float *s, float *vt) {
    const int64_t k = m < n ? m : n, rows = m > n ? m : n;
    double *work = cuvil_thread_buffer(CUVIL_BUF_LINALG, sizeof(double) * (size_t)(rows * k + k * k + k + 1));
    for (int64_t b = 0; b < batch; b++) {
        const float *A = a + b * m * n;
        float *U = u + b * m * k, *S = s + b * k, *VT = vt + b * k * n;
        if (!work) {
            for (int64_t i = 0; i < m * k; i++) U[i] = NAN;
            for (int64_t i = 0; i < k; i++) S[i] = NAN;
            for (int64_t i = 0; i < k * n; i++) VT[i] = NAN;
            continue;
        }
        if (m >= n) {
            for (int64_t i = 0; i < m * n; i++) work[i] = A[i];
            svd_tall(m, n, work, work + m * n, work + m * n + n * n, U, S, VT, 0, k, n);
        } else {                                             /* A^T = V S U^T: U and V^T trade places */
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) work[j * m + i] = A[i * n + j];
            svd_tall(n, m, work, work + n * m, work + n * m + m * m, U, S, VT, 1, k, n);
        }
    }
}

/* ---- LDL^T (Bunch-Kaufman), as LAPACK's ssytf2 with uplo = 'L' ----------------------------------------- */
static int64_t ldl_iamax(const float *x, int64_t n, int64_t stride) {     /* the first of equal magnitudes */
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (fabsf(x[i * stride]) > fabsf(x[best * stride])) best = i;
    return best;
}

static void ldl_swap(float *x, float *y, int64_t n, int64_t sx, int64_t sy) {
    for (int64_t i = 0; i < n; i++) {
        float t = x[i * sx];
        x[i * sx] = y[i * sy];
        y[i * sy] = t;
    }
}

void cuvil_ldl_factor(int64_t batch, int64_t n, const float *a, float *ld, int32_t *piv, int32_t *info) {
    const float alpha = (1.f + sqrtf(17.f)) / 8.f;
    for (int64_t b = 0; b < batch; b++) {
        float *A = ld + b * n * n;
        int32_t *p = piv + b * n;
        if (A != a + b * n * n) memcpy(A, a + b * n * n, sizeof(float) * n * n);
        info[b] = 0;
#define AT(i, j) A[(i) * n + (j)]
        for (int64_t k = 0; k < n;) {
            int64_t kstep = 1, kp = k, imax = k;
            float absakk = fabsf(AT(k, k)), colmax = 0.f;
            if (k < n - 1) {
                imax = k + 1 + ldl_iamax(&AT(k + 1, k), n - k - 1, n);
                colmax = fabsf(AT(imax, k));
            }
            if (fmaxf(absakk, colmax) == 0.f || isnan(absakk)) {
                if (!info[b]) info[b] = (int32_t)(k + 1);                   /* a zero column: D is singular */
            } else {
                if (absakk < alpha * colmax) {
                    int64_t jmax = k + ldl_iamax(&AT(imax, k), imax - k, 1);     /* row imax, left of the diagonal */
                    float rowmax = fabsf(AT(imax, jmax));
                    if (imax < n - 1) {
                        jmax = imax + 1 + ldl_iamax(&AT(imax + 1, imax), n - imax - 1, n);
                        rowmax = fmaxf(rowmax, fabsf(AT(jmax, imax)));
                    }
                    if (absakk >= alpha * colmax * (colmax / rowmax)) kp = k;
                    else if (fabsf(AT(imax, imax)) >= alpha * rowmax) kp = imax;
                    else { kp = imax; kstep = 2; }
                }
                int64_t kk = k + kstep - 1;
                if (kp != kk) {                  /* swap rows and columns kk and kp of the trailing matrix */
                    if (kp < n - 1) ldl_swap(&AT(kp + 1, kk), &AT(kp + 1, kp), n - kp - 1, n, n);
                    ldl_swap(&AT(kk + 1, kk), &AT(kp, kk + 1), kp - kk - 1, n, 1);
                    float t = AT(kk, kk); AT(kk, kk) = AT(kp, kp); AT(kp, kp) = t;
                    if (kstep == 2) { t = AT(k + 1, k); AT(k + 1, k) = AT(kp, k); AT(kp, k) = t; }
                }
                if (kstep == 1) {
                    if (k < n - 1) {
                        float d11 = 1.f / AT(k, k);
                        for (int64_t j = k + 1; j < n; j++)          /* the lower triangle: A -= d11 x x^T */
                            for (int64_t i = j; i < n; i++) AT(i, j) -= d11 * AT(i, k) * AT(j, k);
                        for (int64_t i = k + 1; i < n; i++) AT(i, k) *= d11;
                    }
                } else if (k < n - 2) {
                    float d21 = AT(k + 1, k), d11 = AT(k + 1, k + 1) / d21, d22 = AT(k, k) / d21;
                    float t = 1.f / (d11 * d22 - 1.f);
                    d21 = t / d21;
                    for (int64_t j = k + 2; j < n; j++) {
                        float wk = d21 * (d11 * AT(j, k) - AT(j, k + 1));
                        float wkp1 = d21 * (d22 * AT(j, k + 1) - AT(j, k));
                        for (int64_t i = j; i < n; i++) AT(i, j) -= AT(i, k) * wk + AT(i, k + 1) * wkp1;
                        AT(j, k) = wk;
                        AT(j, k + 1) = wkp1;
                    }
                }
            }
            if (kstep == 1) p[k] = (int32_t)(kp + 1);
            else p[k] = p[k + 1] = (int32_t)(-(kp + 1));
            k += kstep;
        }
        for (int64_t i = 0; i < n; i++)                           /* torch zeroes the upper triangle */
            for (int64_t j = i + 1; j < n; j++) AT(i, j) = 0.f;
    }
}

/* A X = B from the factors, as LAPACK's ssytrs (uplo = 'L'): L D then L^T, pivots applied on the way. A
 * pivot out of [1, n] clamps into it (a corrupt input gives some answer, never a read out of bounds). */
/* A pivot's 0-based row, clamped into [0, n) (0, INT_MIN and out-of-range entries included). */
static inline int64_t ldl_row(int32_t v, int64_t n) {
    int64_t a = v > 0 ? (int64_t)v : -(int64_t)v;
    return (a < 1 ? 1 : a > n ? n : a) - 1;
}

void cuvil_ldl_solve(int64_t batch, int64_t n, int64_t m, const float *ld, const int32_t *piv, const float *bin,
                     float *x) {
    for (int64_t b = 0; b < batch; b++) {
        const float *A = ld + b * n * n;
        const int32_t *p = piv + b * n;
        float *B = x + b * n * m;
        if (B != bin + b * n * m) memcpy(B, bin + b * n * m, sizeof(float) * n * m);
#define ROW(i) (B + (i) * m)
#define PIVOT(v) ldl_row((v), n)
        for (int64_t k = 0; k < n;) {
            int64_t kp = PIVOT(p[k]);
            if (p[k] > 0 || k == n - 1) {
                if (kp != k) ldl_swap(ROW(k), ROW(kp), m, 1, 1);
                for (int64_t i = k + 1; i < n; i++)
                    for (int64_t c = 0; c < m; c++) ROW(i)[c] -= AT(i, k) * ROW(k)[c];
                for (int64_t c = 0; c < m; c++) ROW(k)[c] /= AT(k, k);
                k += 1;
            } else {
                if (kp != k + 1) ldl_swap(ROW(k + 1), ROW(kp), m, 1, 1);
                for (int64_t i = k + 2; i < n; i++)
                    for (int64_t c = 0; c < m; c++) ROW(i)[c] -= AT(i, k) * ROW(k)[c] + AT(i, k + 1) * ROW(k + 1)[c];
                float akm1k = AT(k + 1, k), akm1 = AT(k, k) / akm1k, ak = AT(k + 1, k + 1) / akm1k;
                float denom = akm1 * ak - 1.f;
                for (int64_t c = 0; c < m; c++) {
                    float bkm1 = ROW(k)[c] / akm1k, bk = ROW(k + 1)[c] / akm1k;
                    ROW(k)[c] = (ak * bkm1 - bk) / denom;
                    ROW(k + 1)[c] = (akm1 * bk - bkm1) / denom;
                }
                k += 2;
            }
        }
        for (int64_t k = n - 1; k >= 0;) {
            if (p[k] > 0 || k == 0) {
                for (int64_t c = 0; c < m; c++) {
                    float s = 0.f;
                    for (int64_t i = k + 1; i < n; i++) s += AT(i, k) * ROW(i)[c];
                    ROW(k)[c] -= s;
                }
                int64_t kp = PIVOT(p[k]);
                if (kp != k) ldl_swap(ROW(k), ROW(kp), m, 1, 1);
                k -= 1;
            } else {
                for (int64_t c = 0; c < m; c++) {
                    float s = 0.f, s1 = 0.f;
                    for (int64_t i = k + 1; i < n; i++) { s += AT(i, k) * ROW(i)[c]; s1 += AT(i, k - 1) * ROW(i)[c]; }
                    ROW(k)[c] -= s;
                    ROW(k - 1)[c] -= s1;
                }
                int64_t kp = PIVOT(p[k]);
                if (kp != k) ldl_swap(ROW(k), ROW(kp), m, 1, 1);
                k -= 2;
            }
        }
#undef ROW
#undef PIVOT
    }
}
#undef AT
