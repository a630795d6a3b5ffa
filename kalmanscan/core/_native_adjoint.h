/* The adjoint of the log-likelihood for one tile of lanes: the gradient of sum_n w_n loglik_n with
 * respect to every input, by one reverse pass with checkpoints. Included by _native.c once per
 * dtype with KS_FT and KS_NAME (as _native_kernel.h). Inputs are read in their dtype; the
 * recomputed forward and the adjoint run in float64 for both dtypes.
 *
 * The step (one lane; x = (u, e, v) the normalized state entering step t):
 *     predict  (U1, V1, E1) = (u + q v, p u + d v, c (u + q v) + al e),  s1 = max(U1, V1)
 *     update   (U2, E2, V2) = (R u1 + h^2 v1, R e1 + h z v1, R v1)  [observed],  s2 = max(U2, V2)
 *     loglik   ll = -0.5 (log 2 pi + log S - log u1 + D^2 / (u1 S)),  S = U2, D = z u1 - h e1
 * with (u1, e1, v1) = (U1, E1, V1) / s1 and the next state (U2, E2, V2) / s2. The log-likelihood
 * is homogeneous of degree 0 in every state, so the normalizing factors s1, s2 are constants for
 * the gradient (their derivatives meet the adjoint orthogonally: Euler's theorem). So the adjoint
 * of a known state x is orthogonal to x; the reverse step conserves its component along x (that
 * component neither grows nor decays), and there it is the adjoint of the states' scale, which
 * every step's parameters move: the rounding left there each step would add up and reach every
 * later partial (a shared parameter's gradient off by ~eps T^2 relative: 6e-9 at T = 1e6). It is
 * removed every KS_ADJ_PROJECT steps (the adjoint projected orthogonally to x; in exact arithmetic
 * a no-op): 1e-13 at T = 1e6, as every step, which cost 5 % of a one-lane pass.
 * With forget (a == 0) q = 1, d = p, al = 0, else q = 0, d = a*a, al = a, as in the contract (and
 * V1 = v where U1 = 0 and V1 is below the input dtype's normal range `vmin`: a diffuse state
 * stays diffuse also where a*a v underflows or is subnormal in that dtype, as in the forward;
 * there the adjoint of the state's precision does not grow by 1/(a*a) a step). At a diffuse
 * predicted state (u1 = e1 = 0, v1 = 1) the adjoint of v1 is exactly 0 (Euler's theorem again),
 * so it is set to 0: its rounding would be multiplied by 1/s1.
 *
 * While a lane stays diffuse nothing depends on its steps' parameters: their partials there are
 * set to exactly 0 (by selection), both the predict's where the state entering is diffuse (U1 =
 * 0) and the observation's where the update leaves it diffuse (h = 0 or not observed; a loading
 * 0 there has no derivative, the exact diffuse log-likelihood jumps where it becomes nonzero).
 * The adjoint of the diffuse state itself grows like 1/(a*a) (1/a) a step back (1e200 a step at
 * a = 1e-100, 4^600 over 600 steps of a = 0.5) and met those zeros (inf * 0: every gradient NaN);
 * it reaches only the initial state, whose gradient is 0 where it is not finite at a diffuse
 * start (not flagged). At a step that forgets (a = 0) from a known state, a's partial is the
 * limit's, the predicted mean's c + a e/u: (e/u) U1 gE1. Where a*a is below the normal range
 * (float64) and the state is known, the predicted triple is formed divided, as in the forward
 * (_native_kernel.h), so that a*a v and a e keep their digits.
 *
 * Extremes (float64 inputs). The adjoint of a state is about (loglik) / u: with u = 1/var it
 * passed the range where |loglik| var does (a log-likelihood of -3.2e99 at a predicted variance
 * of 1e300: NaN gradients, an OverflowError), as did the update's R e1 (obs_var 1e300 times a
 * mean of 1e10) and the innovation's square. The forward rows that look for them (every row of
 * the checkpoint sweep, and of a block's recompute where the sweep found one in the block) mark
 * a lane's step wide where its predicted or updated variance is above 2^64 (or its variance
 * entering, at a step that forgets), a value is not finite or D^2 passes 2^1000; such a step is
 * redone in the wide form (ks_wide_fwd, ks_wide_step: lane by lane), which holds a triple whose
 * variance is above 2^64 at u = 2^-64
 * (steps.normalize) and forms the update's products in a power-of-two scaling (steps.observe),
 * and its 1/s1 is stored as -1 so that the reverse redoes it wide as well. Other steps, and every
 * step of a lane whose variances stay below 2^64 and whose values stay in range, run the
 * arithmetic above unchanged (bit for bit). */

#define KS_G(name) KS_CAT(KS_NAME, name)

#ifndef KS_ADJ_STEP_DEFINED /* the float64 step and its reverse: once for both dtypes */
#define KS_ADJ_STEP_DEFINED
#define KS_ADJ_PROJECT 8 /* reverse steps between projections of the adjoint (header) */
/* One forward step in float64 from the normalized state x; returns the pieces the adjoint needs. */
typedef struct {
    double U1, u1, e1, v1, r1, r2; /* unnormalized U1; normalized predicted; 1/s1, 1/s2 */
    int observed;
    int wide; /* the step is one the wide form takes (ks_wide_fwd) */
} ks_fwd;

static KS_INLINE void ks_adj_fwd(double z, double R, double a, double p, double h, double c,
                                 double u, double e, double v, const double vmin, const int given,
                                 double r1_in, double r2_in, const int rare, ks_fwd *f,
                                 double *nu, double *ne, double *nv) {
    const double a2 = a * a;
    const int forget = a == 0.0;
    const double U1 = forget ? u + v : u;
    const double V0 = forget ? p * U1 : p * u + a2 * v;
    const double V1 = (U1 > 0.0) | (V0 >= vmin) ? V0 : v;
    const double E1 = c * U1 + (forget ? 0.0 : a * e);
    const double q_ = forget ? 1.0 : 0.0;
    const double r1 = given ? r1_in : 1.0 / (U1 >= V1 ? U1 : V1);
    /* a*a below the normal range (float64 only) and a known state: divided first (written as
     * arithmetic on sm, 0 or 1: with a select here the reverse row was left scalar) */
    /* rare (compile-time in the row functions): a row holding such a decay; elsewhere the terms
     * are left out (0 * x is not folded away: +17 % a step on a one-lane row) */
    const double sm = a2 < DBL_MIN ? (U1 >= DBL_MIN ? 1.0 - q_ : 0.0) : 0.0;
    const double u1 = U1 * r1;
    const double e1 = rare ? E1 * r1 + sm * ((c * u1 + a * (e * r1)) - E1 * r1) : E1 * r1;
    const double v1 = rare ? V1 * r1 + sm * ((p * u1 + (a * (v * r1)) * a) - V1 * r1) : V1 * r1;
    const int observed = (z == z) & (R <= DBL_MAX);
    const double zz = observed ? z : 0.0, RR = observed ? R : 1.0;
    const double hv = h * v1;
    const double U2 = observed ? RR * u1 + h * hv : u1;
    const double E2 = observed ? RR * e1 + zz * hv : e1;
    const double V2 = observed ? RR * v1 : v1;
    const double r2 = given ? r2_in : 1.0 / (U2 >= V2 ? U2 : V2);
    *nu = U2 * r2;
    *ne = E2 * r2;
    *nv = V2 * r2;
    /* wide (read only by the rows that look for it): a predicted or updated variance above
     * 2^64 (x (x - 2^-64) < 0: x in (0, 2^-64)), a value past the range (sn 0 is NaN there; V2 =
     * R v1 is finite where v1 <= 1), an innovation whose square passes it, or a held state
     * (v > 1) entering a step that forgets (a rare row: of the steps a held state enters, the only
     * one whose arithmetic above passes the range, the slope's mean times u + v) */
    const double D = zz * u1 - h * e1, sn = *nu + *ne;
    const double h1 = (u1 - 0x1p-64) * u1, h2 = (*nu - 0x1p-64) * *nu;
    f->wide = (rare & (v > 1.0)) | ((h1 < h2 ? h1 : h2) < 0.0) |
              ((D * D + sn * 0.0 <= 0x1p1000) ^ 1);
    f->U1 = U1;
    f->u1 = u1;
    f->e1 = e1;
    f->v1 = v1;
    f->r1 = r1;
    f->r2 = r2;
    f->observed = observed;
}

/* The reverse of one step: adjoint (lu, le, lv) of the next state in, of the state x out, given
 * the step's normalizing factors r1 = 1/s1, r2 = 1/s2; the step's partials (weight w on its
 * log-likelihood term). forgets: the row holds a decay 0 (a's partial there divides by u). */
static KS_INLINE void ks_adj_step(const int forgets, double z, double R, double a, double p,
                                  double h, double c, double u, double e, double v,
                                  const double vmin, double r1, double r2, double w, double *lu,
                                  double *le, double *lv, double *gz, double *gR, double *ga,
                                  double *gp, double *gh, double *gc) {
    ks_fwd f;
    double nu, ne, nv;
    ks_adj_fwd(z, R, a, p, h, c, u, e, v, vmin, 1, r1, r2, forgets, &f, &nu, &ne, &nv);
    const int obs = f.observed;
    const double zz = obs ? z : 0.0, RR = obs ? R : 1.0;
    const double u1 = f.u1, e1 = f.e1, v1 = f.v1;
    /* through the update's normalization and the update */
    const double gU2 = *lu * f.r2, gE2 = *le * f.r2, gV2 = *lv * f.r2;
    double gu1 = obs ? RR * gU2 : gU2;
    double ge1 = obs ? RR * gE2 : gE2;
    double gv1 = obs ? h * h * gU2 + h * zz * gE2 + RR * gV2 : gV2;
    /* an update that leaves a diffuse state diffuse: no partials through the state */
    const int stays = (u1 == 0.0) & ((h == 0.0) | (obs ^ 1));
    double dR = obs & (stays ^ 1) ? u1 * gU2 + e1 * gE2 + v1 * gV2 : 0.0;
    double dh = obs & (stays ^ 1) ? 2.0 * h * v1 * gU2 + zz * v1 * gE2 : 0.0;
    double dz = obs & (stays ^ 1) ? h * v1 * gE2 : 0.0;
    /* the log-likelihood term */
    const int known = u1 > 0.0;
    const int contrib = obs & (known | (h == 0.0));
    const double ku = known ? u1 : 1.0;
    const double S = known ? RR * ku + h * h * v1 : RR;
    const double D = zz * ku - h * (known ? e1 : 0.0);
    const double iuS = 1.0 / (ku * S), iS = ku * iuS, iu = S * iuS;
    const double Q = D * D * iuS;
    const double wc = contrib ? w : 0.0;
    const double dS = -0.5 * wc * (1.0 - Q) * iS; /* d ll / d S */
    const double dD = -wc * D * iuS;              /* d ll / d D */
    const double kn = known ? 1.0 : 0.0;
    gu1 += kn * (0.5 * wc * (1.0 + Q) * iu + dS * RR + dD * zz);
    gv1 += kn * dS * h * h;
    ge1 += kn * (-h * dD);
    dR += dS * ku;
    dh += kn * (2.0 * h * v1 * dS - e1 * dD);
    dz += dD * ku;
    /* through the predict's normalization and the predict (a diffuse predicted state: the
     * adjoint of v1 is 0, header) */
    const double gU1 = gu1 * f.r1, gE1 = ge1 * f.r1, gV1 = (known ? gv1 : 0.0) * f.r1;
    const double a2 = a * a;
    /* kept = 0: a diffuse state whose a*a v underflowed or is subnormal, V1 = v */
    /* (U1 > 0 or a normal V0, written so that the row vectorizes) */
    const double normal_v0 = p * u + a2 * v >= vmin ? 1.0 : 0.0;
    const int forget = a == 0.0, kept = f.U1 + normal_v0 > 0.0;
    const double q = forget ? 1.0 : 0.0, d = forget ? p : (kept ? a2 : 1.0);
    const double al = forget ? 0.0 : a;
    *lu = gU1 + p * gV1 + c * gE1;
    *lv = q * gU1 + d * gV1 + q * c * gE1;
    *le = al * gE1;
    /* the predict's partials: 0 where a diffuse state enters a step that keeps it (U1 = 0;
     * gV1 is 0 there, gE1 selected away); at a step that forgets from a known state, a's is
     * the limit's (header). (Written so that the row vectorizes: f.U1 > 0 in the select, or
     * e / u, left it scalar.) */
    const double gEl = (u > 0.0) | forget ? gE1 : 0.0;
    *gp = u * gV1 + q * v * gV1;
    *ga = forget ? 0.0 : (kept ? 2.0 * a * v * gV1 : 0.0) + e * gEl;
    if (forgets) {
        const double kf = u >= vmin ? q : 0.0;
        const double mean = e * (1.0 / (u >= vmin ? u : 1.0));
        *ga += kf * mean * f.U1 * gEl;
    }
    *gc = f.U1 * gEl;
    *gz = dz;
    *gR = dR;
    *gh = dh;
}

/* The adjoint (lu, le, lv) of nb known states (xu, xe, xv) made orthogonal to them: the rounding
 * the reverse steps left along the state removed (header); diffuse states are left as they are. */
KS_CLONES static void ks_adj_project(Py_ssize_t nb, const double *restrict xu,
                                     const double *restrict xe, const double *restrict xv,
                                     double *restrict lu, double *restrict le,
                                     double *restrict lv) {
    for (Py_ssize_t j = 0; j < nb; j++) {
        /* (a held state, v > 1 (ks_wide_fwd): scaled to v = 1, the same direction) */
        const double sc = xv[j] > 1.0 ? 1.0 / xv[j] : 1.0;
        const double u = xu[j] * sc, e = xe[j] * sc, v = xv[j] * sc;
        const double ixx = 1.0 / (u * u + e * e + v * v); /* max(u, v) = 1: no underflow */
        const double drift = (lu[j] * u + le[j] * e + lv[j] * v) * ixx;
        const double k = (u > 0.0) & (drift - drift == 0.0) ? drift : 0.0;
        lu[j] -= k * u;
        le[j] -= k * e;
        lv[j] -= k * v;
    }
}

/* ---- The wide form of a step (float64 inputs; header "Extremes"): the steps the ordinary
 * arithmetic does not hold, one lane at a time. */

/* The wide form's normalizer of a triple: U 2^64 where its variance V/U is above 2^64 (and at
 * most 2^1022: its precision a normal number), which holds U at 2^-64 (steps.normalize), else
 * max(U, V). */
static inline double ks_hold_norm(double U, double V) {
    const int held = (V > U * 0x1p64) & (U > 0.0) & (V <= U * 0x1p1022);
    return held ? U * 0x1p64 : (U >= V ? U : V);
}

typedef struct {
    int k0, k2, observed, lost;
    double u, e, v;            /* the state entering, times 2^k0 */
    double U1, r1, u1, e1, v1; /* the predicted triple: unnormalized U1, 1/normalizer, normalized */
    double U2, r2;             /* the update times 2^k2 (its first entry), 1/its normalizer */
} ks_wide;

/* One step in the wide form: as ks_adj_fwd, with the predicted and updated triples normalized
 * by ks_hold_norm, the update's products formed in a power-of-two scaling 2^k2 (ks_sprod3;
 * steps.observe), a state entering a step that forgets scaled first by a power of two near its v
 * (c (u + v) passed the range; steps.predict) and a predicted variance past the range lost
 * (the prediction (0, 0, 1), as steps.predict: the log-likelihood is NaN there by design). */
static void ks_wide_fwd(double z, double R, double a, double p, double h, double c, double u,
                        double e, double v, const double vmin, ks_wide *f, double *nu,
                        double *ne, double *nv) {
    const int forget = a == 0.0;
    f->k0 = forget && v > 1.0 ? -ks_expo(v) : 0;
    u = ldexp(u, f->k0);
    e = ldexp(e, f->k0);
    v = ldexp(v, f->k0);
    f->u = u;
    f->e = e;
    f->v = v;
    const double a2 = a * a;
    double U1 = forget ? u + v : u;
    const double V0 = forget ? p * U1 : p * u + a2 * v;
    double V1 = (U1 > 0.0) | (V0 >= vmin) ? V0 : v;
    double E1 = c * U1 + (forget ? 0.0 : a * e);
    f->lost = !(V1 <= DBL_MAX);
    if (f->lost) {
        U1 = 0.0;
        E1 = 0.0;
        V1 = 1.0;
    }
    const double r1 = 1.0 / ks_hold_norm(U1, V1);
    const double u1 = U1 * r1;
    double e1 = E1 * r1, v1 = V1 * r1;
    if (!forget && !f->lost && a2 < DBL_MIN && U1 >= DBL_MIN) { /* divided first (header) */
        e1 = c * u1 + a * (e * r1);
        v1 = p * u1 + (a * (v * r1)) * a;
    }
    f->U1 = U1;
    f->r1 = r1;
    f->u1 = u1;
    f->e1 = e1;
    f->v1 = v1;
    f->observed = (z == z) & (R <= DBL_MAX);
    int k = 0;
    double U2 = u1, E2 = e1, V2 = v1;
    if (f->observed) {
        const int eR = ks_expo(R), eh = ks_expo(h), ez = ks_expo(z);
        const int eu = ks_expo(u1), ee = ks_expo(e1), ev = ks_expo(v1);
        int eA = u1 != 0.0 ? eR + eu : KS_LOW_EXP;
        if (h != 0.0 && v1 != 0.0) eA = ks_imax(eA, 2 * eh + ev);
        const int top = ks_imax(ks_imax(eR + ev, eR + ee), ez + eh + ev);
        k = ks_imin(eA == KS_LOW_EXP ? 0 : -eA, 1022 - top);
        U2 = ks_sprod(R, u1, k) + ks_sprod3(h, h, v1, k);
        E2 = ks_sprod(R, e1, k) + ks_sprod3(z, h, v1, k);
        V2 = ks_sprod(R, v1, k);
    }
    f->k2 = k;
    const double r2 = 1.0 / ks_hold_norm(U2, V2);
    f->U2 = U2;
    f->r2 = r2;
    *nu = U2 * r2;
    *ne = E2 * r2;
    *nv = V2 * r2;
}

/* The reverse of one step in the wide form (ks_adj_step's arguments; the step's normalizing
 * factors recomputed). The update's adjoint is formed in its scaling (ks_sprod3), and the
 * log-likelihood term's from the innovation z - h mean and its variance's reciprocal 1/S' (S' =
 * R + h^2 var), never from their unscaled products: D^2 and 1/u- (D = u- (z - h mean)) passed
 * the range where |loglik| var does (a log-likelihood of -3.2e99 at a predicted variance of
 * 1e300). */
static void ks_wide_step(double z, double R, double a, double p, double h, double c, double u,
                         double e, double v, const double vmin, double w, double *lu,
                         double *le, double *lv, double *gz, double *gR, double *ga, double *gp,
                         double *gh, double *gc) {
    ks_wide f;
    double nu, ne, nv;
    ks_wide_fwd(z, R, a, p, h, c, u, e, v, vmin, &f, &nu, &ne, &nv);
    const int obs = f.observed, k = f.k2;
    const double zz = obs ? z : 0.0, RR = obs ? R : 1.0;
    const double u1 = f.u1, e1 = f.e1, v1 = f.v1;
    /* through the update's normalization and the update (its scaling 2^k a constant) */
    const double Lu = *lu * f.r2, Le = *le * f.r2, Lv = *lv * f.r2;
    double gu1 = Lu, ge1 = Le, gv1 = Lv, dR = 0.0, dh = 0.0, dz = 0.0;
    const int stays = (u1 == 0.0) & ((h == 0.0) | (obs ^ 1));
    if (obs) {
        gu1 = ks_sprod(RR, Lu, k);
        ge1 = ks_sprod(RR, Le, k);
        gv1 = ks_sprod3(h, h, Lu, k) + ks_sprod3(h, zz, Le, k) + ks_sprod(RR, Lv, k);
        if (!stays) {
            dR = ks_sprod(u1, Lu, k) + ks_sprod(e1, Le, k) + ks_sprod(v1, Lv, k);
            dh = 2.0 * ks_sprod3(h, v1, Lu, k) + ks_sprod3(zz, v1, Le, k);
            dz = ks_sprod3(h, v1, Le, k);
        }
    }
    /* the log-likelihood term: ll = -0.5 (log 2 pi + log S' + Q), Q = innov^2 / S'; A and B are
     * its derivatives in S = u- S' and D = u- innov, times u- */
    const int known = u1 > 0.0;
    const int contrib = obs & (known | (h == 0.0));
    const double wc = contrib ? w : 0.0;
    double iS = 0.0, innov = 0.0; /* 1/S', the innovation */
    if (contrib) {
        iS = known ? ldexp(u1 / f.U2, k) : 1.0 / RR; /* (U2 = 2^k S) */
        innov = known ? zz - h * (e1 / u1) : zz;
    }
    const double Q = innov * (innov * iS);
    const double A = -0.5 * wc * (1.0 - Q) * iS;
    const double B = -wc * innov * iS;
    if (known) {
        const double iu = 1.0 / u1;
        gu1 += (0.5 * wc * (1.0 + Q) + A * RR + B * zz) * iu;
        gv1 += (A * h) * h * iu;
        ge1 += -h * B * iu;
        /* 2 h (var A), and where var A passes the range (|loglik| var does: a loading of 0
         * at a predicted variance of 1e300 beside data of 1e50, inf, and times h = 0 NaN)
         * 2 h var A in a power-of-two scaling. (Not var (h A), as steps.loglik_terms'
         * h (h v-) orders it: h A underflows in the units the API gives a loading of
         * 1e-300 there, h 3e-147 and obs_var 1e307.) */
        const double vA = (v1 * iu) * A;
        dh += (vA - vA == 0.0 ? 2.0 * h * vA : ks_sprod3(h, v1 * iu, A, 1)) - (e1 * iu) * B;
    }
    dR += A;
    dz += B;
    /* through the predict's normalization and the predict, from the state times 2^k0 */
    double gU1 = gu1 * f.r1, gE1 = ge1 * f.r1, gV1 = (known ? gv1 : 0.0) * f.r1;
    if (f.lost) gU1 = gE1 = gV1 = 0.0; /* (the prediction depends on nothing) */
    const double us = f.u, es = f.e, vs = f.v, a2 = a * a;
    const double normal_v0 = p * us + a2 * vs >= vmin ? 1.0 : 0.0;
    const int forget = a == 0.0, kept = f.U1 + normal_v0 > 0.0;
    const double q = forget ? 1.0 : 0.0, d = forget ? p : (kept ? a2 : 1.0);
    const double al = forget ? 0.0 : a;
    *lu = ldexp(gU1 + p * gV1 + c * gE1, f.k0);
    *lv = ldexp(q * gU1 + d * gV1 + q * c * gE1, f.k0);
    *le = ldexp(al * gE1, f.k0);
    const double gEl = (us > 0.0) | forget ? gE1 : 0.0;
    *gp = us * gV1 + q * vs * gV1;
    double gaa = forget ? 0.0 : (kept ? 2.0 * a * vs * gV1 : 0.0) + es * gEl;
    if (forget && u >= vmin) gaa += (e / u) * f.U1 * gEl; /* the limit's (header) */
    *ga = gaa;
    *gc = f.U1 * gEl;
    *gz = dz;
    *gR = dR;
    *gh = dh;
}

#endif

/* Steps [t0, t1) of nb lanes forward from the states in (xu, xe, xv) (advanced in place); where
 * `keep` is given, step t's state in and normalizing factors are stored at
 * keep[(t - t0) * 5 W + {0, W, 2 W, 3 W, 4 W}] = (u, e, v, 1/s1, 1/s2). */
static KS_INLINE void KS_G(_adj_fwd_row)(const int store, const int rare, Py_ssize_t nb,
                                         const KS_FT *restrict zs,
                                         const KS_FT *restrict Rs, const KS_FT *restrict as,
                                         const KS_FT *restrict ps, const KS_FT *restrict hs,
                                         const KS_FT *restrict cs, double *restrict xu,
                                         double *restrict xe, double *restrict xv,
                                         double *restrict k, Py_ssize_t W) {
    for (Py_ssize_t j = 0; j < nb; j++) {
        ks_fwd f;
        double u, e, v;
        ks_adj_fwd(zs[j], Rs[j], as[j], ps[j], hs[j], cs[j], xu[j], xe[j], xv[j], KS_FT_MIN, 0,
                   0.0, 0.0, rare, &f, &u, &e, &v);
        if (store) {
            k[j] = xu[j];
            k[W + j] = xe[j];
            k[2 * W + j] = xv[j];
            k[3 * W + j] = f.r1;
            k[4 * W + j] = f.r2;
        }
        xu[j] = u;
        xe[j] = e;
        xv[j] = v;
    }
}

/* Forward rows that look for wide steps (header "Extremes"): (xu, xe, xv) in, (yu, ye, yv) out,
 * as _adj_fwd_row otherwise; returns whether a lane's step is wide (_adj_fwd_fix redoes it). */
static KS_INLINE int KS_G(_adj_fwd_row_detect)(const int store, const int rare, Py_ssize_t nb,
                                               const KS_FT *restrict zs,
                                               const KS_FT *restrict Rs,
                                               const KS_FT *restrict as,
                                               const KS_FT *restrict ps,
                                               const KS_FT *restrict hs,
                                               const KS_FT *restrict cs,
                                               const double *restrict xu,
                                               const double *restrict xe,
                                               const double *restrict xv, double *restrict yu,
                                               double *restrict ye, double *restrict yv,
                                               double *restrict k, Py_ssize_t W) {
    int any = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        ks_fwd f;
        double u, e, v;
        ks_adj_fwd(zs[j], Rs[j], as[j], ps[j], hs[j], cs[j], xu[j], xe[j], xv[j], KS_FT_MIN, 0,
                   0.0, 0.0, rare, &f, &u, &e, &v);
        if (store) {
            k[j] = xu[j];
            k[W + j] = xe[j];
            k[2 * W + j] = xv[j];
            k[3 * W + j] = f.r1;
            k[4 * W + j] = f.r2;
        }
        yu[j] = u;
        ye[j] = e;
        yv[j] = v;
        any |= f.wide;
    }
    return any;
}

/* The wide steps of a row that reported one: each such lane's step redone in the wide form, and
 * where the states are kept, its 1/s1 stored as -1 (the reverse redoes it wide too). */
static KS_NOINLINE void KS_G(_adj_fwd_fix)(const int rare, Py_ssize_t nb,
                                           const KS_FT *const src[KS_NSERIES], const double *xu,
                                           const double *xe, const double *xv, double *yu,
                                           double *ye, double *yv, double *k, Py_ssize_t W) {
    for (Py_ssize_t j = 0; j < nb; j++) {
        const double z = src[KS_Z][j], R = src[KS_OBS][j], a = src[KS_A][j];
        const double p = src[KS_P][j], h = src[KS_H][j], c = src[KS_C][j];
        ks_fwd f;
        double u, e, v;
        ks_adj_fwd(z, R, a, p, h, c, xu[j], xe[j], xv[j], KS_FT_MIN, 0, 0.0, 0.0, rare, &f, &u, &e,
                   &v);
        if (!f.wide) continue;
        ks_wide fw;
        ks_wide_fwd(z, R, a, p, h, c, xu[j], xe[j], xv[j], KS_FT_MIN, &fw, &yu[j], &ye[j], &yv[j]);
        if (k != NULL) k[3 * W + j] = -1.0;
    }
}

/* The reverse of step t for the lanes a forward row redid wide (1/s1 stored as -1), from their
 * adjoint before the ordinary row (saved in sv: 3 x W), over what that row wrote. */
static KS_NOINLINE void KS_G(_adj_fix)(Py_ssize_t nb, const KS_FT *const src[KS_NSERIES],
                                       const double *xs, const double *w, const double *sv,
                                       double *lu, double *le, double *lv, double *g,
                                       Py_ssize_t W) {
    for (Py_ssize_t j = 0; j < nb; j++) {
        if (!(xs[3 * W + j] < 0.0)) continue;
        double a = sv[j], b = sv[W + j], c = sv[2 * W + j];
        ks_wide_step(src[KS_Z][j], src[KS_OBS][j], src[KS_A][j], src[KS_P][j], src[KS_H][j],
                     src[KS_C][j], xs[j], xs[W + j], xs[2 * W + j], KS_FT_MIN, w[j], &a, &b, &c,
                     &g[KS_Z * W + j], &g[KS_OBS * W + j], &g[KS_A * W + j], &g[KS_P * W + j],
                     &g[KS_H * W + j], &g[KS_C * W + j]);
        lu[j] = a;
        le[j] = b;
        lv[j] = c;
    }
}

/* A row holding a decay 0 or one whose square is below float64's normal range: its steps take
 * the rare forms (the limit's partial at a = 0, the divided triple); other rows leave them out. */
static KS_INLINE int KS_G(_rare_row)(Py_ssize_t nb, const KS_FT *restrict as) {
    int rare = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        const double a = (double)as[j];
        rare |= a * a < DBL_MIN;
    }
    return rare;
}

KS_CLONES static void KS_G(_adj_forward)(const ks_job *job, Py_ssize_t n0, Py_ssize_t nb,
                                         Py_ssize_t W, Py_ssize_t t0, Py_ssize_t t1, KS_FT *buf,
                                         double *xu, double *xe, double *xv, double *keep) {
    const KS_FT *src[KS_NSERIES];
    for (Py_ssize_t t = t0; t < t1; t++) {
        KS_G(_sources)(job, t, n0, nb, buf, W, 1, src);
        double *k = keep ? keep + (t - t0) * 5 * W : NULL;
        if (KS_G(_rare_row)(nb, src[KS_A]))
            KS_G(_adj_fwd_row)(keep != NULL, 1, nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P],
                               src[KS_H], src[KS_C], xu, xe, xv, k, W);
        else if (keep)
            KS_G(_adj_fwd_row)(1, 0, nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P],
                               src[KS_H], src[KS_C], xu, xe, xv, k, W);
        else
            KS_G(_adj_fwd_row)(0, 0, nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P],
                               src[KS_H], src[KS_C], xu, xe, xv, NULL, W);
    }
}

/* Steps [t0, t1) as KS_G(_adj_forward), with the rows that look for wide steps and redo them
 * (x and y: the state tiles in and out of a step, swapped every step; the state ends in x);
 * rowf[t - t0] (where given) is whether step t's row holds a wide step. Returns whether any
 * does. */
KS_CLONES static int KS_G(_adj_forward_wide)(const ks_job *job, Py_ssize_t n0, Py_ssize_t nb,
                                             Py_ssize_t W, Py_ssize_t t0, Py_ssize_t t1,
                                             KS_FT *buf, double *xu, double *xe, double *xv,
                                             double *yu, double *ye, double *yv, double *keep,
                                             double *rowf) {
    const KS_FT *src[KS_NSERIES];
    double *x[3] = {xu, xe, xv}, *y[3] = {yu, ye, yv};
    int any = 0;
    for (Py_ssize_t t = t0; t < t1; t++) {
        KS_G(_sources)(job, t, n0, nb, buf, W, 1, src);
        double *k = keep ? keep + (t - t0) * 5 * W : NULL;
        const int rare = KS_G(_rare_row)(nb, src[KS_A]);
#define KS_ROW(store, rare_)                                                                      \
    KS_G(_adj_fwd_row_detect)(store, rare_, nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P],    \
                              src[KS_H], src[KS_C], x[0], x[1], x[2], y[0], y[1], y[2], k, W)
        const int wide = rare ? (k ? KS_ROW(1, 1) : KS_ROW(0, 1))
                              : (k ? KS_ROW(1, 0) : KS_ROW(0, 0));
#undef KS_ROW
        if (wide) KS_G(_adj_fwd_fix)(rare, nb, src, x[0], x[1], x[2], y[0], y[1], y[2], k, W);
        if (rowf) rowf[t - t0] = wide;
        any |= wide;
        for (int i = 0; i < 3; i++) {
            double *sw = x[i];
            x[i] = y[i];
            y[i] = sw;
        }
    }
    if (x[0] != xu) {
        memcpy(xu, x[0], nb * sizeof(double));
        memcpy(xe, x[1], nb * sizeof(double));
        memcpy(xv, x[2], nb * sizeof(double));
    }
    return any;
}

/* The reverse of step t for nb lanes: adjoint (lu, le, lv) updated in place, partials into
 * g[k * W + j]. forgets: a lane's decay is 0 at step t (compile-time in the callers). */
static KS_INLINE void KS_G(_adj_row_)(const int forgets, Py_ssize_t nb, const KS_FT *restrict zs,
                                     const KS_FT *restrict Rs, const KS_FT *restrict as,
                                     const KS_FT *restrict ps, const KS_FT *restrict hs,
                                     const KS_FT *restrict cs, const double *restrict xu,
                                     const double *restrict xe, const double *restrict xv,
                                     const double *restrict r1, const double *restrict r2,
                                     const double *restrict w, double *restrict lu,
                                     double *restrict le, double *restrict lv,
                                     double *restrict gz, double *restrict gR, double *restrict ga,
                                     double *restrict gp, double *restrict gh,
                                     double *restrict gc) {
    for (Py_ssize_t j = 0; j < nb; j++) {
        double a = lu[j], b = le[j], c = lv[j];
        ks_adj_step(forgets, zs[j], Rs[j], as[j], ps[j], hs[j], cs[j], xu[j], xe[j], xv[j],
                    KS_FT_MIN, r1[j], r2[j], w[j], &a, &b, &c, &gz[j], &gR[j], &ga[j], &gp[j],
                    &gh[j], &gc[j]);
        lu[j] = a;
        le[j] = b;
        lv[j] = c;
    }
}

#define KS_ADJ_ROW_ARGS                                                                        \
    Py_ssize_t nb, const KS_FT *restrict zs, const KS_FT *restrict Rs,                         \
        const KS_FT *restrict as, const KS_FT *restrict ps, const KS_FT *restrict hs,          \
        const KS_FT *restrict cs, const double *restrict xu, const double *restrict xe,        \
        const double *restrict xv, const double *restrict r1, const double *restrict r2,       \
        const double *restrict w, double *restrict lu, double *restrict le,                    \
        double *restrict lv, double *restrict gz, double *restrict gR, double *restrict ga,    \
        double *restrict gp, double *restrict gh, double *restrict gc
#define KS_ADJ_ROW_PASS nb, zs, Rs, as, ps, hs, cs, xu, xe, xv, r1, r2, w, lu, le, lv, gz, gR, ga, gp, gh, gc

KS_CLONES static void KS_G(_adj_row)(KS_ADJ_ROW_ARGS) { KS_G(_adj_row_)(0, KS_ADJ_ROW_PASS); }

KS_CLONES static void KS_G(_adj_row_forgets)(KS_ADJ_ROW_ARGS) {
    KS_G(_adj_row_)(1, KS_ADJ_ROW_PASS);
}

#undef KS_ADJ_ROW_ARGS
#undef KS_ADJ_ROW_PASS

/* Lanes [n0, n0 + nb): scratch of KS_G(_adj_scratch)(T, K, W) doubles; worker: this thread's slot in
 * the per-thread sums of time-only and scalar gradients. Returns KS_NOT_FINITE where a gradient
 * is not finite. */
static size_t KS_G(_adj_scratch)(Py_ssize_t T, Py_ssize_t K, Py_ssize_t W) {
    const Py_ssize_t nblk = (T + K - 1) / K;
    return (size_t)W * (3 * nblk + 5 * K + 3 + 1 + 2 * KS_NSERIES + 3) +
           (size_t)W * KS_NSERIES * sizeof(KS_FT) / sizeof(double) + nblk + K + 8;
}

/* float64 inputs take the wide form where a step needs it (header "Extremes"); float32 inputs,
 * in float64 arithmetic, never pass its range */
#define KS_ADJ_WIDE (sizeof(KS_FT) == sizeof(double))

static int KS_G(_adjoint)(const ks_adj_job *aj, Py_ssize_t n0, Py_ssize_t nb, Py_ssize_t W,
                          double *scratch, int worker) {
    typedef KS_FT FT;
    const ks_job *job = &aj->fwd;
    const Py_ssize_t T = job->T, N = job->N, K = aj->K, nblk = (T + K - 1) / K;
    double *ck = scratch;                 /* nblk x 3 x W: the state entering step b K */
    double *blk = ck + nblk * 3 * W; /* K x 5 x W: a block's states in and normalizing factors */
    double *lu = blk + K * 5 * W, *le = lu + W, *lv = le + W;
    double *w = lv + W;
    double *g = w + W;                    /* KS_NSERIES x W: a step's partials */
    double *gl = g + KS_NSERIES * W;      /* KS_NSERIES x W: sums over time per lane */
    FT *buf = (FT *)(gl + KS_NSERIES * W); /* KS_NSERIES x W gather tiles */
    /* 3 x W: the state tiles out of a step of the forward rows that look for wide steps, and
     * the adjoint in of a reverse row's wide steps; nblk: whether a block holds a wide step;
     * K: whether a step of the block being reversed does */
    double *yy = (double *)(buf + KS_NSERIES * W);
    double *bw = yy + 3 * W, *rowf = bw + nblk;
    /* initial state, normalized (a variance above 2^64 held, as the wide form's states); its
     * factor is kept for the gradient of the state given */
    double *xu = lu, *xe = le, *xv = lv; /* borrowed for the forward sweep */
    for (Py_ssize_t j = 0; j < nb; j++) {
        const Py_ssize_t n = n0 + j;
        const double u = (double)((const FT *)job->x0[0])[n * job->x0_sn[0]];
        const double e = (double)((const FT *)job->x0[1])[n * job->x0_sn[1]];
        const double v = (double)((const FT *)job->x0[2])[n * job->x0_sn[2]];
        const double m = KS_ADJ_WIDE ? ks_hold_norm(u, v) : (u >= v ? u : v);
        xu[j] = u / m;
        xe[j] = e / m;
        xv[j] = v / m;
        w[j] = (double)((const FT *)aj->w)[n * aj->w_sn];
        for (int k = 0; k < KS_NSERIES; k++) gl[k * W + j] = 0.0;
    }
    /* forward sweep: checkpoints at the start of every block */
    for (Py_ssize_t b = 0; b < nblk; b++) {
        double *c = ck + b * 3 * W;
        memcpy(c, xu, nb * sizeof(double));
        memcpy(c + W, xe, nb * sizeof(double));
        memcpy(c + 2 * W, xv, nb * sizeof(double));
        const Py_ssize_t t1 = (b + 1) * K < T ? (b + 1) * K : T;
        /* (the last block is not swept: its recompute looks for wide steps) */
        bw[b] = 1.0;
        if (b + 1 < nblk) {
            if (KS_ADJ_WIDE)
                bw[b] = KS_G(_adj_forward_wide)(job, n0, nb, W, b * K, t1, buf, xu, xe, xv, yy,
                                                yy + W, yy + 2 * W, NULL, NULL);
            else
                KS_G(_adj_forward)(job, n0, nb, W, b * K, t1, buf, xu, xe, xv, NULL);
        }
    }
    for (Py_ssize_t j = 0; j < nb; j++) lu[j] = le[j] = lv[j] = 0.0;
    int flags = 0;
    const KS_FT *src[KS_NSERIES];
    for (Py_ssize_t b = nblk - 1; b >= 0; b--) {
        const Py_ssize_t t0 = b * K, t1 = (b + 1) * K < T ? (b + 1) * K : T;
        double *c = ck + b * 3 * W; /* recompute the block's states from its checkpoint */
        const int wide = KS_ADJ_WIDE && bw[b] != 0.0;
        if (wide)
            KS_G(_adj_forward_wide)(job, n0, nb, W, t0, t1, buf, c, c + W, c + 2 * W, yy, yy + W,
                                    yy + 2 * W, blk, rowf);
        else
            KS_G(_adj_forward)(job, n0, nb, W, t0, t1, buf, c, c + W, c + 2 * W, blk);
        for (Py_ssize_t t = t1 - 1; t >= t0; t--) {
            const double *xs = blk + (t - t0) * 5 * W;
            KS_G(_sources)(job, t, n0, nb, buf, W, 1, src);
            /* a row holding wide steps: their adjoint in kept, for _adj_fix */
            const int fix = wide && rowf[t - t0] != 0.0;
            if (fix)
                for (Py_ssize_t j = 0; j < nb; j++) {
                    yy[j] = lu[j];
                    yy[W + j] = le[j];
                    yy[2 * W + j] = lv[j];
                }
            /* a decay 0 or a tiny one in the row: its own row form (one more division) */
            const int forgets = KS_G(_rare_row)(nb, src[KS_A]);
            (forgets ? KS_G(_adj_row_forgets) : KS_G(_adj_row))(
                nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P], src[KS_H], src[KS_C], xs,
                xs + W, xs + 2 * W, xs + 3 * W, xs + 4 * W, w, lu, le, lv, g + KS_Z * W,
                g + KS_OBS * W, g + KS_A * W, g + KS_P * W, g + KS_H * W, g + KS_C * W);
            if (fix) KS_G(_adj_fix)(nb, src, xs, w, yy, lu, le, lv, g, W);
            if (t % KS_ADJ_PROJECT == 0) ks_adj_project(nb, xs, xs + W, xs + 2 * W, lu, le, lv);
            for (int k = 0; k < KS_NSERIES; k++) {
                const ks_grad *gd = &aj->grad[k];
                if (gd->ptr == NULL) continue;
                const double *gk = g + k * W;
                if (gd->full_t && gd->full_n) {
                    FT *o = (FT *)gd->ptr + t * N + n0;
                    int fin = 1;
                    for (Py_ssize_t j = 0; j < nb; j++) {
                        o[j] = (FT)gk[j];
                        fin &= gk[j] - gk[j] == 0.0;
                    }
                    flags |= fin ? 0 : KS_NOT_FINITE;
                } else if (gd->full_t) { /* [T, 1]: this thread's sum over its lanes */
                    double s = 0.0;
                    for (Py_ssize_t j = 0; j < nb; j++) s += gk[j];
                    aj->tsum[((Py_ssize_t)worker * KS_NSERIES + k) * T + t] += s;
                } else {
                    double *acc = gl + k * W;
                    for (Py_ssize_t j = 0; j < nb; j++) acc[j] += gk[j];
                }
            }
        }
    }
    for (int k = 0; k < KS_NSERIES; k++) {
        const ks_grad *gd = &aj->grad[k];
        if (gd->ptr == NULL || gd->full_t) continue;
        const double *acc = gl + k * W;
        if (gd->full_n) {
            FT *o = (FT *)gd->ptr + n0;
            for (Py_ssize_t j = 0; j < nb; j++) {
                o[j] = (FT)acc[j];
                flags |= acc[j] - acc[j] == 0.0 ? 0 : KS_NOT_FINITE;
            }
        } else {
            double s = 0.0;
            for (Py_ssize_t j = 0; j < nb; j++) s += acc[j];
            aj->ssum[worker * KS_NSERIES + k] += s;
        }
    }
    /* the adjoint of the normalized initial state, divided by its normalizing factor; at a
     * diffuse start 0 where it is not finite (header) */
    for (Py_ssize_t j = 0; j < nb; j++) {
        const Py_ssize_t n = n0 + j;
        const double u = (double)((const FT *)job->x0[0])[n * job->x0_sn[0]];
        const double v = (double)((const FT *)job->x0[2])[n * job->x0_sn[2]];
        const double r = 1.0 / (KS_ADJ_WIDE ? ks_hold_norm(u, v) : (u >= v ? u : v));
        double gx[3] = {lu[j] * r, le[j] * r, lv[j] * r};
        for (int k = 0; k < 3; k++) {
            if (u == 0.0 && !(gx[k] - gx[k] == 0.0)) gx[k] = 0.0;
            if (aj->gx0[k] == NULL) continue;
            flags |= gx[k] - gx[k] == 0.0 ? 0 : KS_NOT_FINITE;
            ((FT *)aj->gx0[k])[n] = (FT)gx[k];
        }
    }
    return flags;
}

#undef KS_ADJ_WIDE
#undef KS_G
