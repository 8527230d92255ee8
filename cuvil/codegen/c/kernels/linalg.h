/* Dense linear algebra on batches of small row-major matrices (ir/ops/linalg.py): LU with partial
 * pivoting as LAPACK's getrf, its pivots as a row order, Cholesky, triangular solves, Householder QR,
 * symmetric eigenvalues and singular values (Jacobi). Scalar loops:
 * these ops sit outside a network's hot path (a det, an inverse, a solve of a few dozen unknowns). */
#ifndef CUVIL_LINALG_H
#define CUVIL_LINALG_H
#include <stdint.h>

/* a [batch][m][n] -> lu (the unit lower factor below the diagonal, the upper on and above it), piv
 * [batch][min(m, n)] (1-based: row j was swapped with row piv[j] - 1), info [batch] (0, or the 1-based
 * column of the first zero pivot). lu may be a. Float32 arithmetic, as sgetrf. */
void cuvil_lu_factor(int64_t batch, int64_t m, int64_t n, const float *a, float *lu, int32_t *piv, int32_t *info);

/* piv [batch][k] -> perm [batch][m]: the swaps applied in order to 0..m-1 (a pivot out of [1, m]
 * clamps into it: a corrupt input gives some order, never a write out of bounds). */
void cuvil_lu_permutation(int64_t batch, int64_t k, int64_t m, const int32_t *piv, int64_t *perm);

/* a [batch][n][n] (its lower triangle) -> l [batch][n][n] with a = l l^T (zeros above the diagonal),
 * info [batch] (0, or the order of the first leading minor that is not positive). Sums in double. */
void cuvil_cholesky(int64_t batch, int64_t n, const float *a, float *l, int32_t *info);

/* x [batch][n][k] with a x = b, a [batch][n][n] triangular (upper or lower; its other triangle not
 * read; unit: its diagonal read as ones), b [batch][n][k]. Sums in double. */
void cuvil_triangular_solve(int64_t batch, int64_t n, int64_t k, const float *a, const float *b, float *x,
                            int upper, int unit);
/* a [batch][m][n] -> qr, tau [batch][min(m, n)] as LAPACK's geqrf: R on and above the diagonal, below it
 * reflector j's entries past its leading 1 (H_j = I - tau_j v_j v_j^T, A = H_0 ... H_{k-1} R). qr may be a. */
void cuvil_householder_qr(int64_t batch, int64_t m, int64_t n, const float *a, float *qr, float *tau);

/* the first n columns of H_0 ... H_{k-1} (LAPACK's orgqr), reflectors as geqrf leaves them in v
 * [batch][m][n] (m >= n >= k) -> q [batch][m][n] */
void cuvil_householder_product(int64_t batch, int64_t m, int64_t n, int64_t k, const float *v, const float *tau,
                               float *q);
/* a [batch][n][n] symmetric (its lower triangle read) -> w [batch][n] ascending, v [batch][n][n] with
 * the eigenvectors as columns: cyclic Jacobi in double (NaN if its buffer cannot be allocated). */
void cuvil_eigh(int64_t batch, int64_t n, const float *a, float *w, float *v);

/* a [batch][m][n] -> u [batch][m][k], s [batch][k] descending, vt [batch][k][n] (k = min(m, n)), a = u
 * diag(s) vt: one-sided Jacobi in double. The vectors' signs are this algorithm's, not LAPACK's. */
void cuvil_svd(int64_t batch, int64_t m, int64_t n, const float *a, float *u, float *s, float *vt);
/* a [batch][n][n] symmetric (its lower triangle read) -> ld [batch][n][n] (L's multipliers below the
 * diagonal, D's 1x1 and 2x2 blocks on and beside it, zeros above), piv [batch][n] (1-based; a 2x2 block's
 * two entries negative) and info [batch]: Bunch-Kaufman, as LAPACK's ssytrf with uplo = 'L'. ld may be a. */
void cuvil_ldl_factor(int64_t batch, int64_t n, const float *a, float *ld, int32_t *piv, int32_t *info);

/* x [batch][n][m] with A x = b, A = P L D L^T P^T as cuvil_ldl_factor leaves it (ssytrs). x may be b. */
void cuvil_ldl_solve(int64_t batch, int64_t n, int64_t m, const float *ld, const int32_t *piv, const float *b,
                     float *x);

#endif
