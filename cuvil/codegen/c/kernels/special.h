/* Special functions, elementwise (ir/ops/elementwise.py's SPECIAL table; semantics and special values
 * as scipy.special, which is their reference): computed in double from the series, asymptotic
 * expansions, integrals and Newton steps in special.c. Scalar code: they sit outside hot paths. */
#ifndef CUVIL_SPECIAL_H
#define CUVIL_SPECIAL_H

double cuvil_erfinv(double y);
double cuvil_ndtri(double p);
double cuvil_erfcx(double x);
double cuvil_log_ndtr(double x);
double cuvil_digamma(double x);
double cuvil_zeta(double s, double q);          /* Hurwitz zeta */
double cuvil_polygamma(double n, double x);
double cuvil_igamma(double a, double x);        /* regularized lower incomplete gamma P(a, x) */
double cuvil_igammac(double a, double x);       /* Q(a, x) = 1 - P(a, x) */
double cuvil_bessel_i(int nu, int scaled, double x);    /* I0, I1; scaled: times exp(-|x|) */
double cuvil_bessel_k(int nu, int scaled, double x);    /* K0, K1; scaled: times exp(x) */
double cuvil_bessel_j(int nu, double x);        /* J0, J1 */
double cuvil_bessel_y(int nu, double x);        /* Y0, Y1 */
double cuvil_spherical_j0(double x);
double cuvil_airy_ai(double x);
/* orthogonal polynomials of degree n (truncated to an integer; negative: 0), kind a character:
 * 't' 'u' 'v' 'w' Chebyshev, 'T' 'U' 'V' 'W' shifted Chebyshev, 'h' Hermite, 'e' Hermite He, 'l'
 * Laguerre, 'p' Legendre */
double cuvil_polynomial(int kind, double x, double n);
#endif
