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
 * (_native_kernel.h), so that a*a v and a e keep their digits. */

#define KS_G(name) KS_CAT(KS_NAME, name)

#ifndef KS_ADJ_STEP_DEFINED /* the float64 step and its reverse: once for both dtypes */
#define KS_ADJ_STEP_DEFINED
#define KS_ADJ_PROJECT 8 /* reverse steps between projections of the adjoint (header) */
/* One forward step in float64 from the normalized state x; returns the pieces the adjoint needs. */
typedef struct {
    double U1, u1, e1, v1, r1, r2; /* unnormalized U1; normalized predicted; 1/s1, 1/s2 */
    int observed;
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
        const double u = xu[j], e = xe[j], v = xv[j];
        const double ixx = 1.0 / (u * u + e * e + v * v); /* max(u, v) = 1: no underflow */
        const double drift = (lu[j] * u + le[j] * e + lv[j] * v) * ixx;
        const double k = (u > 0.0) & (drift - drift == 0.0) ? drift : 0.0;
        lu[j] -= k * u;
        le[j] -= k * e;
        lv[j] -= k * v;
    }
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
    return (size_t)W * (3 * nblk + 5 * K + 3 + 1 + 2 * KS_NSERIES) +
           (size_t)W * KS_NSERIES * sizeof(KS_FT) / sizeof(double) + 8;
}

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
    /* initial state, normalized; its factor is kept for the gradient of the state given */
    double *xu = lu, *xe = le, *xv = lv; /* borrowed for the forward sweep */
    for (Py_ssize_t j = 0; j < nb; j++) {
        const Py_ssize_t n = n0 + j;
        const double u = (double)((const FT *)job->x0[0])[n * job->x0_sn[0]];
        const double e = (double)((const FT *)job->x0[1])[n * job->x0_sn[1]];
        const double v = (double)((const FT *)job->x0[2])[n * job->x0_sn[2]];
        const double m = u >= v ? u : v;
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
        if (b + 1 < nblk) KS_G(_adj_forward)(job, n0, nb, W, b * K, t1, buf, xu, xe, xv, NULL);
    }
    for (Py_ssize_t j = 0; j < nb; j++) lu[j] = le[j] = lv[j] = 0.0;
    int flags = 0;
    const KS_FT *src[KS_NSERIES];
    for (Py_ssize_t b = nblk - 1; b >= 0; b--) {
        const Py_ssize_t t0 = b * K, t1 = (b + 1) * K < T ? (b + 1) * K : T;
        double *c = ck + b * 3 * W; /* recompute the block's states from its checkpoint */
        KS_G(_adj_forward)(job, n0, nb, W, t0, t1, buf, c, c + W, c + 2 * W, blk);
        for (Py_ssize_t t = t1 - 1; t >= t0; t--) {
            const double *xs = blk + (t - t0) * 5 * W;
            KS_G(_sources)(job, t, n0, nb, buf, W, 1, src);
            /* a decay 0 or a tiny one in the row: its own row form (one more division) */
            const int forgets = KS_G(_rare_row)(nb, src[KS_A]);
            (forgets ? KS_G(_adj_row_forgets) : KS_G(_adj_row))(
                nb, src[KS_Z], src[KS_OBS], src[KS_A], src[KS_P], src[KS_H], src[KS_C], xs,
                xs + W, xs + 2 * W, xs + 3 * W, xs + 4 * W, w, lu, le, lv, g + KS_Z * W,
                g + KS_OBS * W, g + KS_A * W, g + KS_P * W, g + KS_H * W, g + KS_C * W);
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
        const double r = 1.0 / (u >= v ? u : v);
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

#undef KS_G
