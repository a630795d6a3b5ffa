/* The filter and smoother of one tile of lanes over all time steps, in homogeneous (u, e, v)
 * coordinates (docs/backend-contract.md). Included by _native.c once per dtype with
 *   KS_FT (float or double), KS_FT_MIN / KS_FT_MAX (its smallest normal and largest finite values),
 *   KS_FT_TRUE_MIN (its smallest subnormal)
 *   and KS_NAME (the prefix of this dtype's functions).
 * Time is the outer loop; the inner loop runs over the tile's contiguous lanes and vectorizes.
 * GCC's vectorizer is fragile here (a select of a constant on an unordered comparison, a fourth
 * term in a flag test, restrict on locals: each silently leaves a row scalar, 3-4x slower); after
 * an edit, check that every row loop reports "loop vectorized":
 *     gcc -O3 -fno-math-errno -fno-trapping-math -fPIC -I$(python -c "import sysconfig;
 *     print(sysconfig.get_paths()['include'])") -c kalmanscan/core/_native.c -o /tmp/n.o
 *     -fopt-info-vec-optimized 2>&1 | grep "loop vectorized" */

#define KS_F(name) KS_CAT(KS_NAME, name)

#ifndef KS_SCALED_DEFINED /* products in power-of-two scalings: once for both dtypes */
#define KS_SCALED_DEFINED
#define KS_LOW_EXP (-(1 << 20)) /* an exponent below every other */
static inline int ks_imax(int a, int b) { return a > b ? a : b; }
static inline int ks_imin(int a, int b) { return a < b ? a : b; }

/* frexp's exponent of x (|x| in [2^(e-1), 2^e)); 0 for 0. */
static inline int ks_expo(double x) {
    int e;
    (void)frexp(x, &e);
    return e;
}

/* x y 2^k from the factors' mantissas and exponents (steps._ScaledProduct): the mantissas'
 * product rounds as x y would, and the scaling is exact where the result is a normal number, so
 * no partial product passes the range where the result does not. For float factors the product
 * is exact in double and rounds once where the caller converts it. */
static inline double ks_sprod(double x, double y, int k) {
    int ex, ey;
    const double mx = frexp(x, &ex), my = frexp(y, &ey);
    return ldexp(mx * my, ex + ey + k);
}

/* x y w 2^k likewise (the mantissas multiplied in that order). */
static inline double ks_sprod3(double x, double y, double w, int k) {
    int ex, ey, ew;
    const double mx = frexp(x, &ex), my = frexp(y, &ey), mw = frexp(w, &ew);
    return ldexp((mx * my) * mw, ex + ey + ew + k);
}
#endif

/* The update (R U + h (h V), R E + z (h V), R V) times 2^k, each product formed by ks_sprod:
 * where R E (or z h V) passes the range though the belief does not (obs_var 1e300 times a mean
 * of 1e10: inf, and an OverflowError), k brings the larger of the first and third entries to
 * about 1, or less where the second would pass the range (steps.observe). The caller normalizes
 * the triple. U, V <= 1 (a normalized triple), so h V is finite. */
static KS_NOINLINE void KS_F(_observe_scaled)(KS_FT R, KS_FT h, KS_FT z, KS_FT U, KS_FT E,
                                              KS_FT V, KS_FT *u, KS_FT *e, KS_FT *v) {
    typedef KS_FT FT;
    const FT hv = h * V;
    const int emax = ks_expo((double)KS_FT_MAX);
    const int eR = ks_expo(R), eU = ks_expo(U), eE = ks_expo(E), eV = ks_expo(V);
    const int eh = ks_expo(h), ehv = ks_expo(hv), ez = ks_expo(z);
    int eA = U != (FT)0 ? eR + eU : KS_LOW_EXP;
    if (hv != (FT)0) eA = ks_imax(eA, eh + ehv);
    const int top = ks_imax(ks_imax(eR + eV, eR + eE), ez + ehv);
    const int k = ks_imin(eA == KS_LOW_EXP ? 0 : -eA, emax - 2 - top);
    *u = (FT)ks_sprod(R, U, k) + (FT)ks_sprod(h, hv, k);
    *e = (FT)ks_sprod(R, E, k) + (FT)ks_sprod(z, hv, k);
    *v = (FT)ks_sprod(R, V, k);
}

/* Divide (U, E, V) by max(U, V), setting the larger of U, V to exactly 1 (the exact form). */
static KS_INLINE void KS_F(_norm)(KS_FT *u, KS_FT *e, KS_FT *v) {
    typedef KS_FT FT;
    const FT U = *u, E = *e, V = *v;
    const int big_u = U >= V;
    const FT m = big_u ? U : V;
    /* the larger entry exactly 1, by arithmetic: GCC does not vectorize a select between a
     * constant and a value on this (unordered) comparison */
    const FT bu = (FT)big_u;
    *u = bu + ((FT)1 - bu) * (U / m);
    *v = ((FT)1 - bu) + bu * (V / m);
    *e = E / m;
}

/* mean e/u, variance v/u, precision u/v, information e/v of a normalized triple (one of u, v is
 * exactly 1), by division: NaN / inf / 0 where u or v is 0, as IEEE division gives. */
static KS_INLINE void KS_F(_moments)(KS_FT u, KS_FT e, KS_FT v, KS_FT *mean, KS_FT *var,
                                     KS_FT *prec, KS_FT *info) {
    typedef KS_FT FT;
    const int big_u = u >= v; /* then u == 1 */
    const FT n = big_u ? v : u;
    const FT en = e / n;
    *mean = big_u ? e : en;
    *var = big_u ? v : (FT)1 / n;
    *prec = big_u ? (FT)1 / n : u;
    *info = big_u ? en : e;
}

/* 2^-k for m in [2^k, 2^(k+1)) (m positive and normal, below 2^(max exponent)): multiplying by
 * it is exact. Integer arithmetic on the exponent field; no division. */
static KS_INLINE KS_FT KS_F(_pow2_inv)(KS_FT m) {
    KS_UINT b;
    memcpy(&b, &m, sizeof b);
    b = (KS_UINT)KS_EXP_TWICE_BIAS - (b & (KS_UINT)KS_EXP_MASK);
    KS_FT r;
    memcpy(&r, &b, sizeof r);
    return r;
}

/* 1/u and 1/v (u, v >= 0, not both 0; inf where 0, so that the moments multiply by them as IEEE
 * division gives). KS_ROW_INEXACT where the smaller is nonzero and below the normal range (its
 * reciprocal could overflow; the caller redoes the step with divisions). Two divisions cost less
 * here than one of u v with the selects and checks it needs. */
static KS_INLINE int KS_F(_recips)(KS_FT u, KS_FT v, KS_FT *iu, KS_FT *iv) {
    typedef KS_FT FT;
    *iu = (FT)1 / u;
    *iv = (FT)1 / v;
    const FT mn = u <= v ? u : v;
    return (((mn == (FT)0) | (mn >= (FT)KS_FT_MIN)) ^ 1) * KS_ROW_INEXACT;
}

/* One step of one lane: the state (u, e, v) in and out, the predicted triple (U, E, V) out, the
 * step's log-likelihood term (float64) out. The update is written (R u + h^2 v, R e + h z v, R v),
 * the contract's (u + phi v, e + r v, v) times R, so a tiny R divides nothing.
 * Exact form (exact = 1): the predicted triple and the state normalized by division, max(u, v) = 1.
 * Where a*a is below the normal range and the state is known (u normal), the predicted triple is
 * formed divided first, (u, c u + a e, p u + a (a v)) / m: a*a v and a e keep their digits where
 * they underflowed (var = 1e100, a = 1e-170, p = 0: the predicted variance 1e-240, not 0);
 * where the update's products pass the range though the updated belief does not, they are formed
 * scaled (_observe_scaled).
 * Fast form: nothing divides on the recursion's path. The predicted triple is not normalized (the
 * log-likelihood term is homogeneous of degree 0 in it) and the state is scaled by a power of two
 * (exact), max(u, v) in [1, 2); it reports KS_ROW_INEXACT (redo with exact = 1) where the
 * predicted triple's scale or any result leaves a safe range, and with `careful` (the step's row
 * holds a decay whose square is below the normal range: _check_row's KS_TINY_DECAY) where a*a
 * and the predicted V are both below it (p u too: the case above); rows of ordinary decays skip
 * that test. Returns also KS_NOT_FINITE (the new state is not finite), KS_Z_INF (z is +-inf) and,
 * from the exact form, KS_LL_LOST (the predicted precision below the normal range after an
 * informative state, or subnormal: the step's log-likelihood term NaN, steps.lost_steps).
 */
static KS_INLINE int KS_F(_step)(const int exact, const int careful, KS_FT z, KS_FT R, KS_FT a,
                                 KS_FT p, KS_FT h, KS_FT c, KS_FT *su, KS_FT *se, KS_FT *sv,
                                 KS_FT *pu, KS_FT *pe, KS_FT *pv, double *ll) {
    typedef KS_FT FT;
    const FT u0 = *su, e0 = *se, v0 = *sv;
    /* a^2 plus the smallest subnormal: a^2 itself from ~1e-307 (float64) up, and positive where it
     * underflows, so a diffuse state (u = 0) stays diffuse (a^2 inf = inf); no select */
    const FT a2 = a * a + (FT)KS_FT_TRUE_MIN;
    const int forget = a == (FT)0;
    /* predict: forget -> (u + v, c (u + v), p (u + v)); else (u, c u + a e, p u + a^2 v) */
    FT U = forget ? u0 + v0 : u0;
    FT V = forget ? p * U : p * u0 + a2 * v0;
    FT E = c * U + (forget ? (FT)0 : a * e0);
    int fl = 0;
    if (exact) {
        if (!forget && a * a < (FT)KS_FT_MIN && u0 >= (FT)KS_FT_MIN) {
            const FT im = (FT)1 / (U >= V ? U : V); /* (U >= u0: finite) */
            U = u0 * im;
            E = c * U + a * (e0 * im);
            V = p * U + (a * (v0 * im)) * a;
        }
        KS_F(_norm)(&U, &E, &V);
        /* a predicted precision below the normal range, not a diffuse state carried on: its
         * log-likelihood term is not representable (NaN below; steps.lost_steps) */
        fl = ((U < (FT)KS_FT_MIN) & (u0 + U > (FT)0)) * KS_LL_LOST;
    } else {
        const FT m1 = U >= V ? U : V;
        fl = (((m1 >= (FT)KS_SAFE_MIN) & (m1 <= (FT)KS_SAFE_MAX)) ^ 1) * KS_ROW_INEXACT;
        /* (a subnormal u in: the exact form decides) */
        fl |= ((U < (FT)KS_FT_MIN) & (U > (FT)0)) * KS_ROW_INEXACT;
        if (careful) /* (a row of a step whose decays hold one with a*a below the range) */
            fl |= ((a2 < (FT)KS_FT_MIN) & (V < (FT)KS_FT_MIN)) * KS_ROW_INEXACT;
    }
    *pu = U;
    *pe = E;
    *pv = V;
    /* update: observed where z is not NaN (and obs_var is finite) */
    const int observed = (z == z) & (R <= (FT)KS_FT_MAX);
    const FT zz = observed ? z : (FT)0, RR = observed ? R : (FT)1;
    const FT hv = h * V;
    FT u = observed ? RR * U + h * hv : U;
    FT e = observed ? RR * E + zz * hv : E;
    FT v = observed ? RR * V : V;
    if (exact) {
        /* a product past the range (R E: obs_var 1e300, mean 1e10): the update scaled */
        if (observed & (((u - u == (FT)0) & (e - e == (FT)0) & (v - v == (FT)0)) ^ 1))
            KS_F(_observe_scaled)(RR, h, zz, U, E, V, &u, &e, &v);
        KS_F(_norm)(&u, &e, &v);
    } else {
        const FT m2 = u >= v ? u : v;
        const FT sc = KS_F(_pow2_inv)(m2);
        fl |= (((m2 >= (FT)KS_FT_MIN) & (m2 <= (FT)KS_SAFE_MAX)) ^ 1) * KS_ROW_INEXACT;
        u *= sc;
        e *= sc;
        v *= sc;
    }
    *su = u;
    *se = e;
    *sv = v;
    const int finite = (e - e == (FT)0) & (u == u) & (v == v);
    /* log-likelihood (exact diffuse convention), in float64 from the predicted triple:
     * S' = h^2 v- + R u-, ll = -0.5 (log 2 pi + log(S'/u-) + (z u- - h e-)^2 / (u- S')) */
    const int known = U > (FT)0;
    const int contrib = observed & (known | (h == (FT)0));
    const double du = known ? (double)U : 1.0;
    const double dh = (double)h, dR = (double)RR;
    double S = known ? dR * du + dh * dh * (double)V : dR;
    S = contrib ? S : 1.0;
    const double D = (double)zz * du - dh * (double)E;
    double l;
    if (exact) {
        l = ks_log(S) - ks_log(du) + (D / du) * (D / S);
    } else {
        /* one division: S/u- = S^2 / (u- S) (range-checked, S^2 too: it loses digits where S
         * is below ~1e-154, e.g. loading 1e-80 with obs_var 1e-300; the exact form takes the
         * rest). D (D / (u- S)), not D^2 / (u- S): D^2 passed the range where the term does
         * not (an innovation of 1e154 in a lane's units with a variance of 1e8, the term 1e300:
         * -inf); where D / (u- S) is below the normal range the term is below 4 * DBL_MIN. */
        const double us = du * S, ius = 1.0 / us, ss = S * S, ratio = ss * ius;
        const double mn = ss < us ? ss : us; /* (a fourth term here left the row scalar) */
        l = ks_log(ratio) + D * (D * ius);
        fl |= (((ratio <= DBL_MAX) & (mn >= DBL_MIN) & finite) ^ 1) * KS_ROW_INEXACT;
    }
    *ll = contrib ? -0.5 * (KS_LOG_2PI + l) : 0.0;
    if (exact && (fl & KS_LL_LOST)) *ll = NAN;
    /* flags by integer arithmetic (a select of ints on a float compare does not vectorize) */
    return fl | ((finite ^ 1) * KS_NOT_FINITE) | (((z == z) & (z - z != (FT)0)) * KS_Z_INF);
}

/* One step of one lane with its outputs: the fast form, or exact = 1. out: 7 pointers to this
 * element's (mean, var, precision, info, pred_mean, pred_var, pred_precision), or write = 0. */
static KS_INLINE int KS_F(_elem)(const int exact, const int careful, const int write, KS_FT z,
                                 KS_FT R, KS_FT a, KS_FT p, KS_FT h, KS_FT c, KS_FT *u, KS_FT *e,
                                 KS_FT *v, double *ll, KS_FT *o_mean, KS_FT *o_var,
                                 KS_FT *o_prec, KS_FT *o_info, KS_FT *o_pmean, KS_FT *o_pvar,
                                 KS_FT *o_pprec) {
    KS_FT pu, pe, pv, pinfo;
    int fl = KS_F(_step)(exact, careful, z, R, a, p, h, c, u, e, v, &pu, &pe, &pv, ll);
    if (write) {
        if (exact) {
            KS_F(_moments)(*u, *e, *v, o_mean, o_var, o_prec, o_info);
            KS_F(_moments)(pu, pe, pv, o_pmean, o_pvar, o_pprec, &pinfo);
        } else {
            KS_FT iu, iv, piu, piv;
            fl |= KS_F(_recips)(*u, *v, &iu, &iv);
            fl |= KS_F(_recips)(pu, pv, &piu, &piv);
            *o_mean = *e * iu;
            *o_var = *v * iu;
            *o_prec = *u * iv;
            *o_info = *e * iv;
            *o_pmean = pe * piu;
            *o_pvar = pv * piu;
            *o_pprec = pu * piv;
        }
    }
    return fl;
}

/* One lane, one step, as the tile rows and the lane-by-lane form both compute it: the fast form,
 * redone with divisions where it reports a value outside the normal range. So a lane's result does
 * not depend on which lanes share its tile or thread. */
static KS_INLINE int KS_F(_elem_fixed)(const int write, KS_FT z, KS_FT R, KS_FT a, KS_FT p,
                                       KS_FT h, KS_FT c, KS_FT *u, KS_FT *e, KS_FT *v, double *ll,
                                       KS_FT *const o[KS_NOUT]) {
    /* (one lane: the careful form's one more test costs nothing that matters) */
    const KS_FT u0 = *u, e0 = *e, v0 = *v;
    KS_FT t7[KS_NOUT];
    KS_FT *w[KS_NOUT];
    for (int k = 0; k < KS_NOUT; k++) w[k] = write ? o[k] : &t7[k];
    int fl = KS_F(_elem)(0, 1, write, z, R, a, p, h, c, u, e, v, ll, w[0], w[1], w[2], w[3],
                         w[4], w[5], w[6]);
    if (fl & KS_ROW_INEXACT) {
        *u = u0;
        *e = e0;
        *v = v0;
        fl = KS_F(_elem)(1, 1, write, z, R, a, p, h, c, u, e, v, ll, w[0], w[1], w[2], w[3],
                         w[4], w[5], w[6]);
    }
    return fl & ~KS_ROW_INEXACT;
}

/* A row of nb lanes, fast form: state (ui, ei, vi, li) in, (uo, eo, vo, lo) out; the caller redoes
 * the lanes of a row that reports KS_ROW_INEXACT one by one from the state in. */
static KS_INLINE int KS_F(_row)(const int write, const int careful, Py_ssize_t nb,
                                const KS_FT *restrict zs,
                                const KS_FT *restrict Rs, const KS_FT *restrict as,
                                const KS_FT *restrict ps, const KS_FT *restrict hs,
                                const KS_FT *restrict cs, const KS_FT *restrict ui,
                                const KS_FT *restrict ei, const KS_FT *restrict vi,
                                const double *restrict li, KS_FT *restrict uo, KS_FT *restrict eo,
                                KS_FT *restrict vo, double *restrict lo, KS_FT *restrict o0,
                                KS_FT *restrict o1, KS_FT *restrict o2, KS_FT *restrict o3,
                                KS_FT *restrict o4, KS_FT *restrict o5, KS_FT *restrict o6) {
    int fl = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        KS_FT u = ui[j], e = ei[j], v = vi[j];
        double l;
        if (write)
            fl |= KS_F(_elem)(0, careful, 1, zs[j], Rs[j], as[j], ps[j], hs[j], cs[j], &u, &e,
                              &v, &l, &o0[j], &o1[j], &o2[j], &o3[j], &o4[j], &o5[j], &o6[j]);
        else
            fl |= KS_F(_elem)(0, careful, 0, zs[j], Rs[j], as[j], ps[j], hs[j], cs[j], &u, &e,
                              &v, &l, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        uo[j] = u;
        eo[j] = e;
        vo[j] = v;
        lo[j] = li[j] + l;
    }
    return fl;
}

/* the state of a tile: u, e, v tiles and the log-likelihood tile */
typedef struct {
    KS_FT *u, *e, *v;
    double *l;
} KS_F(_state);

KS_CLONES static int KS_F(_row_all)(Py_ssize_t nb, const KS_FT *const src[KS_NSERIES],
                                    const KS_F(_state) *in, const KS_F(_state) *out,
                                    KS_FT *const o[KS_NOUT]) {
    return KS_F(_row)(1, 0, nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P], src[KS_H],
                      src[KS_C], in->u, in->e, in->v, in->l, out->u, out->e, out->v, out->l, o[0],
                      o[1], o[2], o[3], o[4], o[5], o[6]);
}

KS_CLONES static int KS_F(_row_ll)(Py_ssize_t nb, const KS_FT *const src[KS_NSERIES],
                                   const KS_F(_state) *in, const KS_F(_state) *out) {
    return KS_F(_row)(0, 0, nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P], src[KS_H],
                      src[KS_C], in->u, in->e, in->v, in->l, out->u, out->e, out->v, out->l, NULL,
                      NULL, NULL, NULL, NULL, NULL, NULL);
}

/* The rows of steps that hold a decay whose square is below the normal range (careful form; kept
 * out of the tile loop). */
KS_NOINLINE static int KS_F(_row_careful)(const int write, Py_ssize_t nb, const KS_FT *const src[KS_NSERIES],
                              const KS_F(_state) *in, const KS_F(_state) *out,
                              KS_FT *const o[KS_NOUT]) {
    if (write)
        return KS_F(_row)(1, 1, nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P], src[KS_H],
                          src[KS_C], in->u, in->e, in->v, in->l, out->u, out->e, out->v, out->l,
                          o[0], o[1], o[2], o[3], o[4], o[5], o[6]);
    return KS_F(_row)(0, 1, nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P], src[KS_H],
                      src[KS_C], in->u, in->e, in->v, in->l, out->u, out->e, out->v, out->l, NULL,
                      NULL, NULL, NULL, NULL, NULL, NULL);
}

/* KS_BAD_INPUT where step t's parameters of nb lanes leave the ranges filter._validate checks:
 * obs_var > 0 (inf: not observed) with 1/obs_var finite and loading^2/obs_var finite, process_var
 * >= 0 finite, decay, loading, offset finite; and where loading != 0 with loading^2 or
 * loading^2/obs_var below the normal range, which filter._validate decides on (refused at a
 * diffuse lane's first informative observation, else the call is exact or redone with the
 * observation rescaled). (z's infinities are KS_Z_INF, in the step.) Also KS_TINY_DECAY (internal)
 * where a decay != 0 has a square below the normal range (the step's row takes the careful
 * form). */
KS_CLONES static int KS_F(_check_row)(Py_ssize_t nb, const KS_FT *restrict Rs,
                                      const KS_FT *restrict as, const KS_FT *restrict ps,
                                      const KS_FT *restrict hs, const KS_FT *restrict cs) {
    typedef KS_FT FT;
    int ok = 1, tiny = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        tiny |= (as[j] * as[j] < (FT)KS_FT_MIN) & (as[j] != (FT)0);
        const FT R = Rs[j], a = as[j], p = ps[j], h = hs[j], c = cs[j], hh = h * h;
        /* information h^2/R an observation adds, and h^2 itself, 0 or normal, else flagged for
         * the API (docs/reliability.md) */
        const int info_ok = (hh <= (FT)KS_FT_MAX) & (hh <= (FT)KS_FT_MAX * R) &
                            ((h == (FT)0) | (hh >= (FT)KS_FT_MIN * R));
        const int obs_ok = (R > (FT)0) & (R * (FT)KS_FT_MAX >= (FT)1) &
                           ((R > (FT)KS_FT_MAX) | info_ok) & ((h == (FT)0) | (hh >= (FT)KS_FT_MIN));
        ok &= obs_ok & (a - a == (FT)0) & (p >= (FT)0) & (p <= (FT)KS_FT_MAX) & (h - h == (FT)0) &
              (c - c == (FT)0);
    }
    return (ok ^ 1) * KS_BAD_INPUT | tiny * KS_TINY_DECAY;
}

/* KS_BAD_INPUT unless (u, e, v) is an initial triple: u, v >= 0 finite and not both 0, e finite,
 * e = 0 where u = 0 (no information, no mean). */
static int KS_F(_check_x0)(KS_FT u, KS_FT e, KS_FT v) {
    const int ok = (u >= 0) & (v >= 0) & (u - u == 0) & (v - v == 0) & ((u > 0) | (v > 0)) &
                   (e - e == 0) & ((u > 0) | (e == 0));
    return (ok ^ 1) * KS_BAD_INPUT;
}

/* The smoother's backward information filter, one step back through step t's inputs: add step t's
 * observation (R-scaled), then step back through its dynamics (forget: nothing is left).
 * Divisions: the smoother is not the hot path of fitting. `odd`: the step's decay has a square
 * outside the normal range (KS_F(_odd_decays)), where the step back (a^2 U, a (E - c U), V + p U)
 * is formed after normalizing the update and divided by |a|, (|a| U, sign(a) (E - c U),
 * (V + p U) / |a|): the same belief with no a^2 to under- or overflow (a = 1e-170, obs_var =
 * 1e-100: the precision 3.4e-240 about the step before, not 0; a = 1e200: the step before known
 * exactly, not NaN); (V + p U) / |a| held at KS_FT_MAX / 4 where it would pass the range (the
 * precision is below it there; the mean is kept), as the torch paths do (every step there:
 * sequential.back_through). Rows of ordinary decays take the plain form. `careful` (the lanes
 * whose step back was not finite, run again: a row's lane, a lone lane's whole pass): where the
 * update's products pass the range though the belief does not (R E: obs_var 1e300, a mean of
 * 1e10), they are formed scaled (_observe_scaled), and the update is normalized before the step
 * back, as in the odd form (its p U1 passed the range where process_var h^2 / obs_var does). */
static KS_INLINE void KS_F(_back)(const int odd, const int careful, KS_FT z, KS_FT R, KS_FT a,
                                  KS_FT p, KS_FT h, KS_FT c, KS_FT *su, KS_FT *se, KS_FT *sv) {
    typedef KS_FT FT;
    const FT U = *su, E = *se, V = *sv;
    const int observed = (z == z) & (R <= (FT)KS_FT_MAX);
    const FT zz = observed ? z : (FT)0, RR = observed ? R : (FT)1;
    const FT hV = h * V;
    FT U1 = observed ? RR * U + h * hV : U;
    FT E1 = observed ? RR * E + zz * hV : E;
    FT V1 = observed ? RR * V : V;
    if (careful && observed &&
        !((U1 - U1 == (FT)0) && (E1 - E1 == (FT)0) && (V1 - V1 == (FT)0)))
        KS_F(_observe_scaled)(RR, h, zz, U, E, V, &U1, &E1, &V1);
    const int forget = a == (FT)0;
    FT u, e, v;
    if (careful && !odd) {
        /* the update normalized before the step back: V1 + p U1 passed the range where
         * process_var h^2 / obs_var does (process_var 1e5, obs_var 1e-304: the smoothed variances
         * inf, the means NaN), though the belief before the step is an ordinary one; held at
         * KS_FT_MAX / 4 as the odd form */
        const FT im = (FT)1 / (U1 >= V1 ? U1 : V1);
        U1 *= im;
        E1 *= im;
        V1 *= im;
        const FT w = V1 + p * U1;
        const FT top = (FT)(KS_FT_MAX / 4);
        u = forget ? (FT)0 : (a * a) * U1;
        e = forget ? (FT)0 : a * (E1 - c * U1);
        v = forget ? (FT)1 : (w <= top ? w : top);
    } else if (odd) {
        /* (max(U1, V1) >= obs_var >= 1/KS_FT_MAX: its reciprocal is finite) */
        const FT im = (FT)1 / (U1 >= V1 ? U1 : V1);
        U1 *= im;
        E1 *= im;
        V1 *= im;
        const FT s = forget ? (FT)1 : (a < (FT)0 ? -a : a);
        const FT w = forget ? U1 + V1 : V1 + p * U1;
        const FT top = s * (FT)(KS_FT_MAX / 4);
        const FT y = E1 - c * U1;
        u = forget ? (FT)0 : s * U1;
        e = forget ? (FT)0 : (a < (FT)0 ? -y : y);
        v = (w <= top ? w : top) / s;
    } else {
        u = forget ? (FT)0 : (a * a) * U1;
        e = forget ? (FT)0 : a * (E1 - c * U1);
        v = forget ? (FT)1 : V1 + p * U1;
    }
    KS_F(_norm)(&u, &e, &v);
    *su = u;
    *se = e;
    *sv = v;
}

/* Whether any of nb decays is nonzero with a square outside the normal range: the backward
 * step's `odd` form (min and max by float selects, which vectorize). */
KS_CLONES static int KS_F(_odd_decays)(Py_ssize_t nb, const KS_FT *restrict as) {
    typedef KS_FT FT;
    FT lo = 1, hi = 1;
    for (Py_ssize_t j = 0; j < nb; j++) {
        const FT a2 = as[j] * as[j];
        lo = (a2 < lo) & (as[j] != (FT)0) ? a2 : lo;
        hi = a2 > hi ? a2 : hi;
    }
    return (lo < (FT)KS_FT_MIN) | (hi > (FT)(1 / KS_FT_MIN));
}

/* The filtered triple of a step from its outputs (exact: the larger of u, v is 1, and the moments
 * of such a triple are its entries), combined with the backward triple by adding precisions;
 * NaN mean and inf variance where neither holds any (as the torch paths' combine). */
static KS_INLINE void KS_F(_combine)(KS_FT mean, KS_FT var, KS_FT prec, KS_FT info, KS_FT U,
                                     KS_FT E, KS_FT V, KS_FT *s_mean, KS_FT *s_var) {
    typedef KS_FT FT;
    const int big_u = var <= (FT)1;
    const FT u = big_u ? (FT)1 : prec, e = big_u ? mean : info, v = big_u ? var : (FT)1;
    const FT den = u * V + U * v;
    const int exact = v == (FT)0;
    const int known = den > (FT)0;
    const FT den_s = known ? den : (FT)1;
    *s_mean = exact ? e : (known ? (e * V + E * v) / den_s : (FT)NAN);
    *s_var = exact ? (FT)0 : (known ? v * V / den_s : (FT)INFINITY);
}

static KS_INLINE int KS_F(_smooth_rows)(Py_ssize_t nb, const KS_FT *restrict zs,
                                       const KS_FT *restrict Rs, const KS_FT *restrict as,
                                       const KS_FT *restrict ps, const KS_FT *restrict hs,
                                       const KS_FT *restrict cs, int back, const int odd,
                                       const KS_FT *restrict mean, const KS_FT *restrict var,
                                       const KS_FT *restrict prec, const KS_FT *restrict info,
                                       const KS_FT *restrict Us, const KS_FT *restrict Es,
                                       const KS_FT *restrict Vs, KS_FT *restrict Uo,
                                       KS_FT *restrict Eo, KS_FT *restrict Vo, KS_FT *restrict sm,
                                       KS_FT *restrict sv) {
    int bad = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        KS_FT U = Us[j], E = Es[j], V = Vs[j];
        KS_F(_combine)(mean[j], var[j], prec[j], info[j], U, E, V, &sm[j], &sv[j]);
        if (back) {
            KS_F(_back)(odd, 0, zs[j], Rs[j], as[j], ps[j], hs[j], cs[j], &U, &E, &V);
            Uo[j] = U;
            Eo[j] = E;
            Vo[j] = V;
            const KS_FT s = U + E + V;
            bad |= (s - s == (KS_FT)0) ^ 1;
        }
    }
    return bad;
}

/* A row of the smoother: combine, and step back (back) from (Us, Es, Vs) to (Uo, Eo, Vo) in the
 * plain form, or in the odd form where the row holds a decay whose square leaves the normal
 * range (its own function, so that the plain rows run the machine code they ran before). Returns
 * 1 where a lane's step back is not finite (the caller redoes it careful). */
#define KS_SMOOTH_ROW(name, odd)                                                                  \
    static int name(Py_ssize_t nb, const KS_FT *restrict zs, const KS_FT *restrict Rs,           \
                    const KS_FT *restrict as, const KS_FT *restrict ps,                          \
                    const KS_FT *restrict hs, const KS_FT *restrict cs, int back,                \
                    const KS_FT *restrict mean, const KS_FT *restrict var,                       \
                    const KS_FT *restrict prec, const KS_FT *restrict info,                      \
                    const KS_FT *restrict Us, const KS_FT *restrict Es,                          \
                    const KS_FT *restrict Vs, KS_FT *restrict Uo, KS_FT *restrict Eo,            \
                    KS_FT *restrict Vo, KS_FT *restrict sm, KS_FT *restrict sv) {                \
        return KS_F(_smooth_rows)(nb, zs, Rs, as, ps, hs, cs, back, odd, mean, var, prec, info,  \
                                  Us, Es, Vs, Uo, Eo, Vo, sm, sv);                               \
    }
KS_CLONES KS_SMOOTH_ROW(KS_F(_smooth_row), 0)
KS_NOINLINE KS_SMOOTH_ROW(KS_F(_smooth_row_odd), 1)
#undef KS_SMOOTH_ROW

/* Pointers to step t's parameters for lanes [n0, n0 + nb): the series itself where its lanes are
 * contiguous, else a tile of `buf` (gathered; broadcast values filled once per tile when constant
 * in time, which the caller marks by passing t < 0 for the first fill). */
static void KS_F(_sources)(const ks_job *job, Py_ssize_t t, Py_ssize_t n0, Py_ssize_t nb,
                           KS_FT *buf, Py_ssize_t W, int first, const KS_FT *src[KS_NSERIES]) {
    for (int k = 0; k < KS_NSERIES; k++) {
        const ks_series *s = &job->in[k];
        const KS_FT *p = (const KS_FT *)s->ptr + t * s->st + n0 * s->sn;
        if (s->sn == 1) {
            src[k] = p;
            continue;
        }
        KS_FT *b = buf + k * W;
        src[k] = b;
        if (s->st == 0 && !first) continue; /* filled at the tile's first step */
        if (s->sn == 0) {
            const KS_FT x = p[0];
            for (Py_ssize_t j = 0; j < nb; j++) b[j] = x;
        } else {
            for (Py_ssize_t j = 0; j < nb; j++) b[j] = p[j * s->sn];
        }
    }
}

/* The smoother of lane n on its own (the filter's outputs written): the backward information
 * filter from B_{T-1} = (0, 0, 1), combined with the filtered state at each step. Returns 1 where
 * a step back was not finite (the caller runs the lane again careful: _back). */
static KS_INLINE int KS_F(_lane_back)(const int careful, const ks_job *job, Py_ssize_t n,
                                      const KS_FT *zp, const KS_FT *op, const KS_FT *ap,
                                      const KS_FT *pp, const KS_FT *hp, const KS_FT *cp) {
    typedef KS_FT FT;
    const Py_ssize_t T = job->T, N = job->N;
    const ks_series *in = job->in;
    FT U = 0, E = 0, V = 1;
    FT *const *out = (FT *const *)job->out;
    int bad = 0;
    for (Py_ssize_t t = T - 1; t >= 0; t--) {
        const Py_ssize_t at = t * N + n;
        KS_F(_combine)(out[KS_MEAN][at], out[KS_VAR][at], out[KS_PREC][at], out[KS_INFO][at], U,
                       E, V, (FT *)job->smooth[0] + at, (FT *)job->smooth[1] + at);
        if (t > 0) {
            const FT a = ap[t * in[KS_A].st], a2 = a * a;
            const int odd = ((a2 < (FT)KS_FT_MIN) & (a != (FT)0)) | (a2 > (FT)(1 / KS_FT_MIN));
            KS_F(_back)(odd, careful, zp[t * in[KS_Z].st], op[t * in[KS_OBS].st], a,
                        pp[t * in[KS_P].st], hp[t * in[KS_H].st], cp[t * in[KS_C].st], &U, &E, &V);
            const FT s = U + E;
            bad |= (s - s == (FT)0) ^ 1;
        }
    }
    return bad;
}

/* Fewer lanes than a vector: each lane runs through all steps on its own (time inner), reading
 * parameters through their strides; the recursion's latency, not per-step overhead, sets the
 * pace. Same per-element arithmetic as the tile rows. */
KS_CLONES static int KS_F(_lanes)(const ks_job *job, Py_ssize_t n0, Py_ssize_t nb) {
    typedef KS_FT FT;
    const Py_ssize_t T = job->T, N = job->N;
    const ks_series *in = job->in;
    const int write = job->out[0] != NULL;
    int fixed = 1; /* parameters constant in time: checked once */
    for (int k = KS_OBS; k < KS_NSERIES; k++) fixed &= in[k].st == 0;
    int flags = 0;
    for (Py_ssize_t n = n0; n < n0 + nb; n++) {
        const FT *zp = (const FT *)in[KS_Z].ptr + n * in[KS_Z].sn;
        const FT *op = (const FT *)in[KS_OBS].ptr + n * in[KS_OBS].sn;
        const FT *ap = (const FT *)in[KS_A].ptr + n * in[KS_A].sn;
        const FT *pp = (const FT *)in[KS_P].ptr + n * in[KS_P].sn;
        const FT *hp = (const FT *)in[KS_H].ptr + n * in[KS_H].sn;
        const FT *cp = (const FT *)in[KS_C].ptr + n * in[KS_C].sn;
        FT u = ((const FT *)job->x0[0])[n * job->x0_sn[0]];
        FT e = ((const FT *)job->x0[1])[n * job->x0_sn[1]];
        FT v = ((const FT *)job->x0[2])[n * job->x0_sn[2]];
        flags |= KS_F(_check_x0)(u, e, v);
        KS_F(_norm)(&u, &e, &v);
        double ll = 0.0;
        for (Py_ssize_t t = 0; t < T; t++) {
            FT *o[KS_NOUT];
            for (int k = 0; k < KS_NOUT; k++) o[k] = write ? (FT *)job->out[k] + t * N + n : NULL;
            double l;
            if (t == 0 || !fixed)
                flags |= KS_F(_check_row)(1, op + t * in[KS_OBS].st, ap + t * in[KS_A].st,
                                          pp + t * in[KS_P].st, hp + t * in[KS_H].st,
                                          cp + t * in[KS_C].st) &
                         ~KS_TINY_DECAY;
            flags |= KS_F(_elem_fixed)(write, zp[t * in[KS_Z].st], op[t * in[KS_OBS].st],
                                       ap[t * in[KS_A].st], pp[t * in[KS_P].st],
                                       hp[t * in[KS_H].st], cp[t * in[KS_C].st], &u, &e, &v, &l,
                                       o);
            ll += l;
        }
        KS_F(_norm)(&u, &e, &v); /* the contract's max(u, v) = 1 */
        ((FT *)job->final[0])[n] = u;
        ((FT *)job->final[1])[n] = e;
        ((FT *)job->final[2])[n] = v;
        ((FT *)job->loglik)[n] = (FT)ll;
        /* (NaN where a step flagged KS_LL_LOST: by design, not an overflow) */
        flags |= ll - ll == 0.0 || (ll != ll && (flags & KS_LL_LOST)) ? 0 : KS_NOT_FINITE;
        if (job->smooth[0] != NULL && KS_F(_lane_back)(0, job, n, zp, op, ap, pp, hp, cp))
            KS_F(_lane_back)(1, job, n, zp, op, ap, pp, hp, cp);
    }
    return flags;
}

/* Lanes [n0, n0 + nb) over all steps (nb <= W). work: 6 state tiles (the state in and out of a
 * step, swapped every step, so a row can be redone from its state in) and KS_NSERIES gather tiles;
 * acc: 2 log-likelihood tiles. */
static int KS_F(_tile)(const ks_job *job, Py_ssize_t n0, Py_ssize_t nb, Py_ssize_t W, KS_FT *work,
                       double *acc) {
    typedef KS_FT FT;
    const Py_ssize_t T = job->T, N = job->N;
    const int write = job->out[0] != NULL;
    KS_F(_state) st[2] = {{work, work + W, work + 2 * W, acc},
                          {work + 3 * W, work + 4 * W, work + 5 * W, acc + W}};
    FT *buf = work + 6 * W;
    const FT *src[KS_NSERIES];
    /* parameters constant in time are checked once (their gather tiles are filled once) */
    int fixed = 1;
    for (int k = KS_OBS; k < KS_NSERIES; k++) fixed &= job->in[k].st == 0;
    int seen = 0, careful = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        const Py_ssize_t n = n0 + j;
        FT u = ((const FT *)job->x0[0])[n * job->x0_sn[0]];
        FT e = ((const FT *)job->x0[1])[n * job->x0_sn[1]];
        FT v = ((const FT *)job->x0[2])[n * job->x0_sn[2]];
        seen |= KS_F(_check_x0)(u, e, v);
        KS_F(_norm)(&u, &e, &v);
        st[0].u[j] = u;
        st[0].e[j] = e;
        st[0].v[j] = v;
        st[0].l[j] = 0.0;
    }
    for (Py_ssize_t t = 0; t < T; t++) {
        const KS_F(_state) *in = &st[t & 1], *out = &st[(t & 1) ^ 1];
        KS_F(_sources)(job, t, n0, nb, buf, W, t == 0, src);
        if (t == 0 || !fixed) {
            const int ck = KS_F(_check_row)(nb, src[KS_OBS], src[KS_A], src[KS_P], src[KS_H],
                                            src[KS_C]);
            careful = (ck & KS_TINY_DECAY) != 0;
            seen |= ck;
        }
        FT *o[KS_NOUT];
        for (int k = 0; k < KS_NOUT; k++)
            o[k] = write ? (FT *)job->out[k] + t * N + n0 : NULL;
        int fl = careful  ? KS_F(_row_careful)(write, nb, src, in, out, o)
                 : write ? KS_F(_row_all)(nb, src, in, out, o)
                         : KS_F(_row_ll)(nb, src, in, out);
        if (fl & KS_ROW_INEXACT) { /* redo the row lane by lane, exact where needed */
            fl = 0;
            for (Py_ssize_t j = 0; j < nb; j++) {
                FT *oj[KS_NOUT];
                for (int k = 0; k < KS_NOUT; k++) oj[k] = write ? o[k] + j : NULL;
                FT u = in->u[j], e = in->e[j], v = in->v[j];
                double l;
                fl |= KS_F(_elem_fixed)(write, src[KS_Z][j], src[KS_OBS][j], src[KS_A][j],
                                        src[KS_P][j], src[KS_H][j], src[KS_C][j], &u, &e, &v, &l,
                                        oj);
                out->u[j] = u;
                out->e[j] = e;
                out->v[j] = v;
                out->l[j] = in->l[j] + l;
            }
        }
        seen |= fl;
    }
    const KS_F(_state) *fin = &st[T & 1];
    for (Py_ssize_t j = 0; j < nb; j++) {
        const Py_ssize_t n = n0 + j;
        FT u = fin->u[j], e = fin->e[j], v = fin->v[j];
        KS_F(_norm)(&u, &e, &v); /* the contract's max(u, v) = 1 */
        ((FT *)job->final[0])[n] = u;
        ((FT *)job->final[1])[n] = e;
        ((FT *)job->final[2])[n] = v;
        ((FT *)job->loglik)[n] = (FT)fin->l[j];
        const double lj = fin->l[j];
        seen |= lj - lj == 0.0 || (lj != lj && (seen & KS_LL_LOST)) ? 0 : KS_NOT_FINITE;
    }
    if (job->smooth[0] != NULL) { /* backward information filter, from B_{T-1} = (0, 0, 1) */
        /* (the state tiles in and out of a step back, swapped every step) */
        const KS_F(_state) *bi = &st[0], *bo = &st[1];
        for (Py_ssize_t j = 0; j < nb; j++) {
            bi->u[j] = 0;
            bi->e[j] = 0;
            bi->v[j] = 1;
        }
        const int a_fixed = job->in[KS_A].st == 0;
        int odd = 0;
        for (Py_ssize_t t = T - 1; t >= 0; t--) {
            const Py_ssize_t row = t * N + n0;
            KS_F(_sources)(job, t, n0, nb, buf, W, t == T - 1, src);
            FT *const *out = (FT *const *)job->out;
            if (t == T - 1 || !a_fixed) odd = KS_F(_odd_decays)(nb, src[KS_A]);
            const int bad = (odd ? KS_F(_smooth_row_odd) : KS_F(_smooth_row))(
                nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P], src[KS_H], src[KS_C], t > 0,
                out[KS_MEAN] + row, out[KS_VAR] + row, out[KS_PREC] + row, out[KS_INFO] + row,
                bi->u, bi->e, bi->v, bo->u, bo->e, bo->v, (FT *)job->smooth[0] + row,
                (FT *)job->smooth[1] + row);
            if (bad) { /* a step back not finite: redo those lanes careful */
                for (Py_ssize_t j = 0; j < nb; j++) {
                    const FT s = bo->u[j] + bo->e[j] + bo->v[j];
                    if (s - s == (FT)0) continue;
                    FT U = bi->u[j], E = bi->e[j], V = bi->v[j];
                    KS_F(_back)(odd, 1, src[KS_Z][j], src[KS_OBS][j], src[KS_A][j], src[KS_P][j],
                                src[KS_H][j], src[KS_C][j], &U, &E, &V);
                    bo->u[j] = U;
                    bo->e[j] = E;
                    bo->v[j] = V;
                }
            }
            const KS_F(_state) *sw = bi;
            bi = bo;
            bo = sw;
        }
    }
    return seen & (KS_NOT_FINITE | KS_Z_INF | KS_BAD_INPUT | KS_LL_LOST);
}

#undef KS_F
