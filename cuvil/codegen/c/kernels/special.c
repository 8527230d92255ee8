#include "special.h"

#include <math.h>
#include <stdint.h>

#define PI 3.14159265358979323846
#define EULER_GAMMA 0.57721566490153286061

/* ---- error function inverses ------------------------------------------------------------------- */
/* x >= 0 with erf(x) = y, erfc(x) = q (= 1 - y; the caller gives each exactly where it is small):
 * Winitzki's closed form (within 2e-3) from log(1 - y^2), then Newton steps on erf, or on erfc in the
 * tail, where 1 - erf(x) would cancel. */
static double erfinv_pos(double y, double q) {
    const double a = 0.147, L = y < 0.5 ? log1p(-y * y) : log(q * (2 - q)), t = 2 / (PI * a) + L / 2;
    double x = sqrt(sqrt(t * t - L / a) - t);
    for (int i = 0; i < 4; i++) {
        double slope = 2 / sqrt(PI) * exp(-x * x);
        x += (y < 0.5 ? y - erf(x) : erfc(x) - q) / slope;
    }
    return x;
}

double cuvil_erfinv(double y) {
    if (isnan(y) || fabs(y) > 1) return NAN;
    if (fabs(y) == 1) return copysign(INFINITY, y);
    if (y == 0) return y;
    return copysign(erfinv_pos(fabs(y), 1 - fabs(y)), y);
}

/* The standard normal quantile: sqrt(2) erfinv(2p - 1), with 2p or 2 - 2p as the exact tail. */
double cuvil_ndtri(double p) {
    if (isnan(p) || p < 0 || p > 1) return NAN;
    if (p == 0 || p == 1) return p == 0 ? -INFINITY : INFINITY;
    return p < 0.5 ? -sqrt(2) * erfinv_pos(1 - 2 * p, 2 * p) : sqrt(2) * erfinv_pos(2 * p - 1, 2 - 2 * p);
}

/* exp(x^2) erfc(x); past 25, where erfc underflows, its asymptotic series */
double cuvil_erfcx(double x) {
    if (isnan(x)) return x;
    if (x < 25) return exp(x * x) * erfc(x);
    double s = 1, t = 1, r = 1 / (2 * x * x);
    for (int k = 1; k < 12; k++) {
        t *= -(2 * k - 1) * r;
        s += t;
    }
    return s / (x * sqrt(PI));
}

/* log of the standard normal CDF: log1p of the small tail above 0; below, through erfcx so that the
 * tail's exp(-x^2 / 2) is a term of the log, never a number that underflows */
double cuvil_log_ndtr(double x) {
    if (isnan(x)) return x;
    double z = x / sqrt(2);
    if (x > 0) return log1p(-0.5 * erfc(z));
    return log(0.5 * cuvil_erfcx(-z)) - z * z;
}

/* ---- gamma family --------------------------------------------------------------------------------- */
double cuvil_digamma(double x) {
    if (isnan(x) || x == INFINITY) return x;
    if (x == 0) return signbit(x) ? INFINITY : -INFINITY;
    if (x < 0 && x == floor(x)) return NAN;          /* the poles, and -inf */
    double r = 0;
    if (x < 0) {                                     /* psi(x) = psi(1 - x) - pi / tan(pi x) */
        r = -PI / tan(PI * (x - nearbyint(x)));
        x = 1 - x;
    }
    for (; x < 10; x += 1) r -= 1 / x;                /* psi(x) = psi(x + 1) - 1 / x */
    double w = 1 / (x * x);
    return r + log(x) - 0.5 / x -
           w * (1.0 / 12 - w * (1.0 / 120 - w * (1.0 / 252 - w * (1.0 / 240 - w * (1.0 / 132)))));
}

/* B_2j / (2j)!, the Euler-Maclaurin corrections */
static const double EM[12] = {0.08333333333333333, -0.001388888888888889, 3.306878306878307e-05,
                              -8.267195767195768e-07, 2.08767569878681e-08, -5.284190138687493e-10,
                              1.3382536530684679e-11, -3.3896802963225827e-13, 8.586062056277845e-15,
                              -2.174868698558062e-16, 5.5090028283602295e-18, -1.3954464685812522e-19};

/* Hurwitz zeta, sum over k >= 0 of (q + k)^-s (Cephes' domain: s > 1; q <= 0 only for an integer s, a
 * pole at an integer q): the terms below q + k = 9 summed, the rest by Euler-Maclaurin. A q below
 * -2^24 (2^24 terms) gives NaN rather than a loop that long. */
double cuvil_zeta(double s, double q) {
    if (s == 1) return INFINITY;                 /* Cephes' order of tests, NaN operands included */
    if (s < 1) return NAN;
    if (q <= 0) {
        if (q == floor(q)) return INFINITY;
        if (s != floor(s) || q < -16777216.0) return NAN;
    }
    if (q > 1e8) return (1 / (s - 1) + 1 / (2 * q)) * pow(q, 1 - s);
    if (isinf(s)) return q == 1 ? 1 : q < 1 ? INFINITY : NAN;
    double sum = 0, a = q;
    for (int k = 0; k < 9 || a <= 9; k++, a += 1) sum += pow(a, -s);
    if (isinf(a)) return sum;
    double tail = pow(a, 1 - s) / (s - 1) + 0.5 * pow(a, -s), rise = s, p = pow(a, -s - 1);
    for (int j = 0; j < 12; j++) {
        tail += EM[j] * rise * p;
        rise *= (s + 2 * j + 1) * (s + 2 * j + 2);
        p /= a * a;
    }
    return sum + tail;
}

double cuvil_polygamma(double n, double x) {
    if (n == 0) return cuvil_digamma(x);
    /* (-1)^(n + 1) n! zeta(n + 1, x) */
    return (fmod(n, 2) == 1 ? 1 : -1) * tgamma(n + 1) * cuvil_zeta(n + 1, x);
}

/* x^a e^-x / Gamma(a): for a large, a (log1p(u) - u) + log(a / 2 pi) / 2 - Stirling's correction, u =
 * x / a - 1 (the direct a log x - x - lgamma(a) cancels terms of size a: 2e-5 relative error at 1e8) */
static double igamma_front(double a, double x) {
    if (a < 10) return exp(a * log(x) - x - lgamma(a));
    double u = (x - a) / a, w = 1 / (a * a);
    double stirling = (1.0 / 12 - w * (1.0 / 360 - w / 1260)) / a;
    return exp(a * (log1p(u) - u) + 0.5 * log(a / (2 * PI)) - stirling);
}

/* The series and the continued fraction need about sqrt(a) terms where x is near a: this many cover a
 * up to 1e12, past which the result loses accuracy (a bound, so a hostile a cannot loop for hours). */
#define IGAMMA_TERMS 20000000

/* P(a, x) (lower) or Q(a, x) (upper): the series for x < a + 1, else Q's continued fraction (modified
 * Lentz); edges as scipy's gammainc / gammaincc. */
static double igamma_part(double a, double x, int upper) {
    if (isnan(a) || isnan(x) || a < 0 || x < 0) return NAN;
    if (a == 0) return x > 0 ? (double)!upper : NAN;
    if (x == 0) return upper;
    if (isinf(a)) return isinf(x) ? NAN : upper;
    if (isinf(x)) return !upper;
    double front = igamma_front(a, x);
    if (x < a + 1) {
        double term = 1 / a, sum = term;
        for (int64_t n = 1; n < IGAMMA_TERMS && fabs(term) > 1e-17 * fabs(sum); n++) {
            term *= x / (a + n);
            sum += term;
        }
        double p = front * sum;
        return upper ? 1 - p : p;
    }
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int64_t i = 1; i < IGAMMA_TERMS; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        d = fabs(d) < tiny ? tiny : d;
        c = b + an / c;
        c = fabs(c) < tiny ? tiny : c;
        d = 1 / d;
        double step = d * c;
        h *= step;
        if (fabs(step - 1) < 1e-16) break;
    }
    double q = front * h;
    return upper ? q : 1 - q;
}

double cuvil_igamma(double a, double x) { return igamma_part(a, x, 0); }
double cuvil_igammac(double a, double x) { return igamma_part(a, x, 1); }

/* ---- Bessel functions of order 0 and 1 -------------------------------------------------------------- */
/* The sum over k of a_k(nu) / x^k, a_k = prod over j <= k of (4 nu^2 - (2j - 1)^2) / (k! 8^k), each term
 * times sign^k, stopped where the terms stop shrinking (the series is asymptotic). */
static double hankel_sum(int nu, double x, double sign) {
    double mu = 4.0 * nu * nu, term = 1, sum = 1;
    for (int k = 1; k < 60; k++) {
        double next = term * sign * (mu - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k * x);
        if (fabs(next) >= fabs(term)) break;
        term = next;
        sum += term;
        if (fabs(term) < 1e-17 * fabs(sum)) break;
    }
    return sum;
}

double cuvil_bessel_i(int nu, int scaled, double x) {
    if (isnan(x)) return x;
    if (isinf(x)) return scaled ? (nu ? copysign(0.0, x) : 0) : NAN;      /* as Cephes */
    double ax = fabs(x), r;
    if (ax <= 30) {                          /* sum (x^2/4)^k / (k! (k + nu)!) * (x/2)^nu: positive terms */
        double h = ax * ax / 4, t = nu ? ax / 2 : 1, s = t;
        for (int k = 1; k < 500 && t > 1e-17 * s; k++) {
            t *= h / ((double)k * (k + nu));
            s += t;
        }
        r = scaled ? s * exp(-ax) : s;
    } else {                                 /* e^x / sqrt(2 pi x) * sum (-1)^k a_k / x^k */
        r = hankel_sum(nu, ax, -1) / sqrt(2 * PI * ax);
        if (!scaled) r *= exp(ax);
    }
    return nu && x < 0 ? -r : r;
}

/* K_nu(x) e^x = integral over t of exp(-x (cosh t - 1)) cosh(nu t): the trapezoid rule on an analytic,
 * doubly exponentially decaying integrand is exact to rounding at a step of 0.1 for x below 25 (the
 * error bound is exp(x (1 - cos d) - 2 pi d / h) for any d < pi / 2); the asymptotic series above. */
double cuvil_bessel_k(int nu, int scaled, double x) {
    if (isnan(x) || x < 0) return NAN;
    if (x == 0) return INFINITY;
    if (isinf(x)) return 0;
    double r;
    if (x >= 25) {
        r = sqrt(PI / (2 * x)) * hankel_sum(nu, x, 1);
    } else {
        const double h = 0.1;
        double sum = 0.5;
        for (int k = 1; k < 20000; k++) {
            double t = k * h, s = sinh(t / 2), e = 2 * x * s * s;
            double f = exp(-e) * (nu ? cosh(t) : 1);
            sum += f;
            if (f < 1e-19 * sum && e > nu * t + 1) break;
        }
        r = h * sum;
    }
    return scaled ? r : r * exp(-x);
}

/* cos and sin of x - (nu / 2 + 1 / 4) pi from cos x and sin x (no pi subtracted from a large x) */
static void hankel_phase(int nu, double x, double *c, double *s) {
    double cx = cos(x), sx = sin(x);
    *c = (nu ? sx - cx : cx + sx) / sqrt(2);
    *s = (nu ? -(sx + cx) : sx - cx) / sqrt(2);
}

/* P and Q of Hankel's expansion: the even and odd terms of a_k / x^k, alternating in sign by pairs */
static void hankel_pq(int nu, double x, double *P, double *Q) {
    double mu = 4.0 * nu * nu, term = 1, p = 1, q = 0;
    for (int k = 1; k < 60; k++) {
        double next = term * (mu - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k * x);
        if (fabs(next) >= fabs(term)) break;
        term = next;
        double signed_term = (k / 2) % 2 ? -term : term;
        if (k % 2) q += signed_term; else p += signed_term;
        if (fabs(term) < 1e-17) break;
    }
    *P = p;
    *Q = q;
}

double cuvil_bessel_j(int nu, double x) {
    if (isnan(x) || isinf(x)) return NAN;                /* as Cephes at the infinities */
    double ax = fabs(x), r;
    if (ax < 12) {                           /* sum (-1)^k (x/2)^(2k + nu) / (k! (k + nu)!) */
        double h = ax * ax / 4, t = nu ? ax / 2 : 1, s = t;
        for (int k = 1; k < 200; k++) {
            t *= -h / ((double)k * (k + nu));
            s += t;
            if (fabs(t) < 1e-17 * fabs(s) && k > h) break;
        }
        r = s;
    } else {
        double P, Q, c, sn;
        hankel_pq(nu, ax, &P, &Q);
        hankel_phase(nu, ax, &c, &sn);
        r = sqrt(2 / (PI * ax)) * (P * c - Q * sn);
    }
    return nu && x < 0 ? -r : r;
}

double cuvil_bessel_y(int nu, double x) {
    if (isnan(x) || x < 0 || isinf(x)) return NAN;
    if (x == 0) return -INFINITY;
    if (x >= 12) {
        double P, Q, c, sn;
        hankel_pq(nu, x, &P, &Q);
        hankel_phase(nu, x, &c, &sn);
        return sqrt(2 / (PI * x)) * (P * sn + Q * c);
    }
    double h = x * x / 4, lg = log(x / 2);
    if (!nu) {   /* Y0 = 2/pi (log(x/2) + gamma) J0 + 2/pi sum_{k>=1} (-1)^(k+1) H_k (x^2/4)^k / (k!)^2 */
        double t = 1, s = 0, harmonic = 0;
        for (int k = 1; k < 200; k++) {
            t *= -h / ((double)k * k);
            harmonic += 1.0 / k;
            s -= t * harmonic;
            if (fabs(t * harmonic) < 1e-17 * fabs(s) && k > h) break;
        }
        return 2 / PI * ((lg + EULER_GAMMA) * cuvil_bessel_j(0, x) + s);
    }
    /* Y1 = -2/(pi x) + 2/pi log(x/2) J1 - 1/pi sum_{k>=0} (-1)^k (psi(k+1) + psi(k+2)) (x/2)^(2k+1) / (k!(k+1)!) */
    double t = x / 2, harmonic = 0, s = t * (2 * -EULER_GAMMA + 1);
    for (int k = 1; k < 200; k++) {
        t *= -h / ((double)k * (k + 1));
        harmonic += 1.0 / k;
        double term = t * (2 * (harmonic - EULER_GAMMA) + 1.0 / (k + 1));
        s += term;
        if (fabs(term) < 1e-17 * fabs(s) && k > h) break;
    }
    return -2 / (PI * x) + 2 / PI * lg * cuvil_bessel_j(1, x) - s / PI;
}

double cuvil_spherical_j0(double x) {
    if (isinf(x)) return 0;
    if (fabs(x) < 1e-4) return 1 - x * x / 6;
    return sin(x) / x;
}

/* ---- Airy Ai ------------------------------------------------------------------------------------------- */
/* Three regions, each accurate to about 1e-12 relative away from Ai's zeros: the Maclaurin series on
 * [-8, 1] (its terms grow to e^(2/3 |x|^1.5) at worst, about 1e6 at -8, against 1e16 of precision), the
 * integral Ai(x) = sqrt(x / 3) / pi * K_1/3(z), K_nu(z) = int_0^inf exp(-z cosh t) cosh(nu t) dt, z =
 * 2/3 x^1.5, by the trapezoid rule above 1 (a smooth, double-exponentially decaying integrand: the rule
 * converges geometrically: a step of a quarter of the peak's width reaches 1e-16), and the oscillating asymptotic series below -8
 * (its smallest term there is about e^(-2z) ~ 1e-13). */
static double airy_series(double x) {
    const double ai0 = 0.355028053887817239260, dai0 = -0.258819403792806798405;
    double x3 = x * x * x, f = 1, g = x, tf = 1, tg = x;
    for (int k = 1; k < 200; k++) {
        tf *= x3 / ((3.0 * k - 1) * (3.0 * k));
        tg *= x3 / ((3.0 * k) * (3.0 * k + 1));
        f += tf;
        g += tg;
        if (fabs(tf) < 1e-17 * fabs(f) && fabs(tg) < 1e-17 * (fabs(g) + 1e-300)) break;
    }
    return ai0 * f + dai0 * g;
}

static double airy_integral(double x) {
    double z = 2.0 / 3.0 * x * sqrt(x), h = 0.25 / sqrt(fmax(z, 1)), sum = 0.5 * exp(-z);  /* the peak is 1/sqrt(z) wide */
    for (int k = 1; k < 400; k++) {
        double t = k * h, term = exp(-z * cosh(t)) * cosh(t / 3);
        sum += term;
        if (term < 1e-18 * sum) break;
    }
    return sqrt(x / 3) / M_PI * sum * h;
}

static double airy_oscillating(double x) {
    double y = -x, z = 2.0 / 3.0 * y * sqrt(y), u = 1, p = 1, q = 0, zk = 1, last = INFINITY;
    for (int k = 1; k < 60; k++) {           /* u_k = u_(k-1) (6k-5)(6k-3)(6k-1) / (216 k (2k-1)) */
        u *= (6.0 * k - 5) * (6.0 * k - 3) * (6.0 * k - 1) / (216.0 * k * (2.0 * k - 1));
        zk *= z;
        double term = u / zk;
        if (term > last) break;              /* the asymptotic series has passed its smallest term */
        last = term;
        if (k % 2) q += ((k / 2) % 2 ? -term : term);
        else p += ((k / 2) % 2 ? -term : term);
    }
    double phase = z + M_PI / 4;
    return (sin(phase) * p - cos(phase) * q) / (sqrt(M_PI) * sqrt(sqrt(y)));
}

double cuvil_airy_ai(double x) {
    if (isinf(x)) return NAN;                /* torch's and scipy's value at either end */
    if (isnan(x)) return x;
    if (x > 1) return airy_integral(x);
    if (x >= -8) return airy_series(x);
    return airy_oscillating(x);
}

/* ---- orthogonal polynomials -------------------------------------------------------------------------- */
/* The first two of a kind, and its three-term recurrence p_{k+1} = (a_k x + b_k) p_k - c_k p_{k-1} */
static void poly_start(int kind, double x, double *p0, double *p1) {
    *p0 = 1;
    switch (kind) {
    case 't': case 'p': case 'e': *p1 = x; break;
    case 'u': case 'h': *p1 = 2 * x; break;
    case 'v': *p1 = 2 * x - 1; break;
    case 'w': *p1 = 2 * x + 1; break;
    default: *p1 = 1 - x; break;                               /* 'l' */
    }
}

static double poly_next(int kind, double x, double k, double p, double q) {   /* p_{k+1} from p_k = q, p_{k-1} = p */
    switch (kind) {
    case 'h': return 2 * x * q - 2 * k * p;
    case 'e': return x * q - k * p;
    case 'l': return ((2 * k + 1 - x) * q - k * p) / (k + 1);
    case 'p': return ((2 * k + 1) * x * q - k * p) / (k + 1);
    default: return 2 * x * q - p;                             /* Chebyshev */
    }
}

/* degrees past which the loop is not run: Chebyshev polynomials have closed forms there; the others
 * give NaN (a degree from a tensor must not become a loop of 2^60 steps) */
#define POLY_LOOP_MAX 1048576.0

double cuvil_polynomial(int kind, double x, double n) {
    if (kind >= 'T' && kind <= 'W') {                            /* shifted Chebyshev: of 2x - 1 */
        kind += 'a' - 'A';
        x = 2 * x - 1;
    }
    n = trunc(n);                                              /* as torch's cast of the degree to int64 */
    if (isnan(n) || n < 0 || n >= 9.2e18) return 0;           /* (NaN and 2^63 up cast to a negative) */
    int cheb = kind == 't' || kind == 'u' || kind == 'v' || kind == 'w', even = fmod(n, 2) == 0;
    if (cheb && fabs(x) == 1) {                                /* the ends, exactly (as torch) */
        switch (kind) {
        case 't': return x > 0 || even ? 1 : -1;
        case 'u': return (x > 0 || even ? 1 : -1) * (n + 1);
        case 'v': return x > 0 ? 1 : (even ? 1 : -1) * (2 * n + 1);
        default: return x > 0 ? 2 * n + 1 : (even ? 1 : -1);
        }
    }
    if (n > POLY_LOOP_MAX) {
        if (!cheb || fabs(x) > 1) return NAN;
        double th = acos(x);                                   /* T cos, U sin, V and W half-angle forms */
        switch (kind) {
        case 't': return cos(n * th);
        case 'u': return sin((n + 1) * th) / sin(th);
        case 'v': return cos((n + 0.5) * th) / cos(th / 2);
        default: return sin((n + 0.5) * th) / sin(th / 2);
        }
    }
    double p, q;
    poly_start(kind, x, &p, &q);
    if (n == 0) return p;
    for (double k = 1; k < n; k++) {
        double r = poly_next(kind, x, k, p, q);
        p = q;
        q = r;
    }
    return q;
}
