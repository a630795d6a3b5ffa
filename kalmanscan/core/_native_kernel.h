/* One tile of lanes over all time steps; included by _native.c once per dtype with
 *   KS_FT (float or double), KS_FT_MIN / KS_FT_MAX (its smallest normal and largest finite
 *   values) and KS_NAME (the tile function's name).
 * Time is the outer loop; the inner loop runs over the tile's contiguous lanes and vectorizes. */

#define KS_CAT_(a, b) a##b
#define KS_CAT(a, b) KS_CAT_(a, b)
#define KS_ROW KS_CAT(KS_NAME, _row)
#define KS_ROW_EXACT KS_CAT(KS_NAME, _row_exact)
#define KS_STEP KS_CAT(KS_NAME, _step)
#define KS_LANES KS_CAT(KS_NAME, _lanes)

/* The arguments of one time step of nb lanes: parameters, state in -> state out, outputs. */
#define KS_ROW_ARGS                                                                                \
    Py_ssize_t nb, const KS_FT *restrict zs, const KS_FT *restrict os, const KS_FT *restrict rs,   \
        const KS_FT *restrict as,                                                                  \
        const KS_FT *restrict ps, const KS_FT *restrict hs, const KS_FT *restrict cs,              \
        const KS_FT *restrict lam_in, const KS_FT *restrict eta_in, const double *restrict acc_in, \
        KS_FT *restrict lam, KS_FT *restrict eta, double *restrict acc, KS_FT *restrict o_lam,     \
        KS_FT *restrict o_eta, KS_FT *restrict o_mean, KS_FT *restrict o_var,                      \
        KS_FT *restrict o_lp, KS_FT *restrict o_mp, KS_FT *restrict o_vp

/* One lane, one step, with the division forms of filter.py's torch path: state (lp, ep) in,
 * (*lam, *eta) and the seven outputs out, the log-density added to *acc. Returns KS_NOT_FINITE when
 * the new lam or eta is not finite, KS_Z_INF when z is infinite. */
static inline int KS_STEP(KS_FT zz, KS_FT o, KS_FT rho, KS_FT a, KS_FT p, KS_FT h, KS_FT c, KS_FT lp,
                          KS_FT ep, KS_FT *lam, KS_FT *eta, double *acc, KS_FT *o_lam,
                          KS_FT *o_eta, KS_FT *o_mean, KS_FT *o_var, KS_FT *o_lp, KS_FT *o_mp,
                          KS_FT *o_vp) {
    typedef KS_FT FT;
    const FT a2 = a * a;
    const int forget = a2 == (FT)0;
    const FT den = (forget ? p : a2) + p * lp;
    const FT lam_pred = (lp + (forget ? (FT)1 : (FT)0)) / den;
    const FT alpha = (forget ? (FT)0 : a) / den;
    const FT eta_pred = alpha * ep + lam_pred * c;
    const int observed = zz == zz && o <= (FT)KS_FT_MAX;
    const FT rho_h = rho * h;
    const FT l = lam_pred + (observed ? rho_h * h : (FT)0);
    const FT e = eta_pred + (observed ? rho_h * zz : (FT)0);
    const FT var_pred = (FT)1 / lam_pred, mean_pred = eta_pred / lam_pred;
    *o_lam = *lam = l;
    *o_eta = *eta = e;
    *o_mean = e / l;
    *o_var = (FT)1 / l;
    *o_lp = lam_pred;
    *o_mp = mean_pred;
    *o_vp = var_pred;
    const int known = lam_pred > (FT)0;
    if (observed && (known || h == (FT)0)) {
        const double s = (double)(h * h * (known ? var_pred : (FT)0) + o);
        const double di = (double)(zz - h * (known ? mean_pred : (FT)0));
        *acc += -0.5 * (KS_LOG_2PI + ks_log(s) + (s <= DBL_MAX ? di * di / s : 0.0));
    }
    return ((l - l == (FT)0) && (e - e == (FT)0) ? 0 : KS_NOT_FINITE) |
           (zz == zz && zz - zz != (FT)0 ? KS_Z_INF : 0);
}

/* A row with the exact step, for the rows where the fast form below could differ by more than
 * rounding. Returns KS_NOT_FINITE when a new lam or eta is not finite. */
static int KS_ROW_EXACT(KS_ROW_ARGS) {
    int flags = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        acc[j] = acc_in[j];
        flags |= KS_STEP(zs[j], os[j], rs[j], as[j], ps[j], hs[j], cs[j], lam_in[j], eta_in[j],
                         &lam[j], &eta[j], &acc[j], &o_lam[j], &o_eta[j], &o_mean[j], &o_var[j],
                         &o_lp[j], &o_mp[j], &o_vp[j]);
    }
    return flags & KS_NOT_FINITE;
}

/* Fewer lanes than a vector: each lane runs through all steps on its own (time inner), reading
 * parameters through their strides; the recursion's latency, not per-step overhead, sets the
 * pace. The log-likelihood goes to acc[0 .. nb). */
static int KS_LANES(const ks_job *job, Py_ssize_t n0, Py_ssize_t nb, double *acc) {
    typedef KS_FT FT;
    const Py_ssize_t T = job->T, N = job->N;
    const ks_series *in = job->in;
    int flags = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        const Py_ssize_t n = n0 + j;
        const FT *zp = (const FT *)in[KS_Z].ptr + n * in[KS_Z].sn;
        const FT *op = (const FT *)in[KS_OBS].ptr + n * in[KS_OBS].sn;
        const FT *ap = (const FT *)in[KS_A].ptr + n * in[KS_A].sn;
        const FT *pp = (const FT *)in[KS_P].ptr + n * in[KS_P].sn;
        const FT *hp = (const FT *)in[KS_H].ptr + n * in[KS_H].sn;
        const FT *cp = (const FT *)in[KS_C].ptr + n * in[KS_C].sn;
        FT lam = ((const FT *)job->lam0)[n * job->lam0_sn];
        FT eta = ((const FT *)job->eta0)[n * job->eta0_sn];
        double ll = 0.0;
        for (Py_ssize_t t = 0; t < T; t++) {
            const FT o = op[t * in[KS_OBS].st];
            const Py_ssize_t at = t * N + n;
            flags |= KS_STEP(zp[t * in[KS_Z].st], o, (FT)1 / o, ap[t * in[KS_A].st],
                             pp[t * in[KS_P].st], hp[t * in[KS_H].st], cp[t * in[KS_C].st], lam,
                             eta, &lam, &eta, &ll, (FT *)job->out[KS_LAM] + at,
                             (FT *)job->out[KS_ETA] + at, (FT *)job->out[KS_MEAN] + at,
                             (FT *)job->out[KS_VAR] + at, (FT *)job->out[KS_LAM_PRED] + at,
                             (FT *)job->out[KS_MEAN_PRED] + at, (FT *)job->out[KS_VAR_PRED] + at);
        }
        acc[j] = ll;
    }
    return flags;
}

/* The same step, vectorized: each denominator is inverted once (mean = eta * (1/lam) rather than
 * eta / lam, within an ulp). Returns flags: KS_ROW_INEXACT when a reciprocal left the normal range
 * (a variance beyond the dtype's range, or a tiny denominator; the caller then recomputes the row
 * exactly), KS_Z_INF when z holds an infinity (the input check this kernel takes over),
 * KS_NOT_FINITE when a new lam or eta is not finite. */
KS_CLONES static int KS_ROW(KS_ROW_ARGS) {
    typedef KS_FT FT;
    int fast_ok = 1, z_inf = 0, finite = 1;
    for (Py_ssize_t j = 0; j < nb; j++) {
        const FT zz = zs[j], o = os[j], a = as[j], p = ps[j], h = hs[j], c = cs[j];
        z_inf |= (zz == zz) & ((zz - zz) != (zz - zz));
        const FT lp = lam_in[j], ep = eta_in[j];
        const FT a2 = a * a;
        const int forget = a2 == (FT)0;
        /* predict: lam_pred = (lam + q) / den, alpha = a (1 - q) / den, den = d + p lam > 0 */
        const FT inv_den = (FT)1 / ((forget ? p : a2) + p * lp);
        const FT lam_pred = (lp + (forget ? (FT)1 : (FT)0)) * inv_den;
        const FT alpha = (forget ? (FT)0 : a) * inv_den;
        const FT eta_pred = alpha * ep + lam_pred * c;
        /* update: observed unless z is NaN or obs_var is inf */
        const int observed = (zz == zz) & (o <= (FT)KS_FT_MAX);
        const FT rho_h = rs[j] * h; /* rs = 1 / obs_var */
        const FT l = lam_pred + (observed ? rho_h * h : (FT)0);
        const FT e = eta_pred + (observed ? rho_h * zz : (FT)0);
        const FT var_pred = (FT)1 / lam_pred, mean_pred = eta_pred * var_pred;
        const FT var = (FT)1 / l;
        o_lam[j] = l;
        o_eta[j] = e;
        o_mean[j] = e * var;
        o_var[j] = var;
        o_lp[j] = lam_pred;
        o_mp[j] = mean_pred;
        o_vp[j] = var_pred;
        lam[j] = l;
        eta[j] = e;
        finite &= (l - l == (FT)0) & (e - e == (FT)0);
        fast_ok &= (inv_den >= (FT)KS_FT_MIN) & (inv_den <= (FT)KS_FT_MAX) &
                   (((var >= (FT)KS_FT_MIN) & (var <= (FT)KS_FT_MAX)) | (l == (FT)0)) &
                   (((var_pred >= (FT)KS_FT_MIN) & (var_pred <= (FT)KS_FT_MAX)) |
                    (lam_pred == (FT)0));
        /* log-likelihood, exact diffuse convention: steps with lam_pred = 0 add nothing (unless
         * h = 0); innovation variance s = h^2 var_pred + obs_var */
        const int known = lam_pred > (FT)0;
        const int contrib = observed & (known | (h == (FT)0));
        const FT s = h * h * (known ? var_pred : (FT)0) + (observed ? o : (FT)1);
        const FT innov = (contrib ? zz : (FT)0) - h * (known ? mean_pred : (FT)0);
        const double s_ok = contrib ? (double)s : 1.0;
        const double di = (double)innov;
        const double quad = s_ok <= DBL_MAX ? di * di / s_ok : 0.0;
        acc[j] = acc_in[j] + (contrib ? -0.5 * (KS_LOG_2PI + ks_log(s_ok) + quad) : 0.0);
    }
    return (fast_ok ? 0 : KS_ROW_INEXACT) | (z_inf ? KS_Z_INF : 0) | (finite ? 0 : KS_NOT_FINITE);
}

/* Lanes [n0, n0 + nb) over all steps. state: 2 x (lam, eta) tiles (in and out, swapped every
 * step); acc: 2 log-likelihood tiles; buf: KS_NSERIES gathered parameter tiles and
 * one for 1 / obs_var. The final
 * log-likelihood is left in acc[0 .. nb). Returns KS_NOT_FINITE when a lam or eta is not finite,
 * plus KS_Z_INF when z holds an infinity. */
static int KS_NAME(const ks_job *job, Py_ssize_t n0, Py_ssize_t nb, KS_FT *state, double *acc,
                   KS_FT *buf) {
    typedef KS_FT FT;
    const Py_ssize_t T = job->T, N = job->N, W = job->tile;
    const FT *src[KS_NSERIES];
    int gather[KS_NSERIES], fixed[KS_NSERIES];
    for (int k = 0; k < KS_NSERIES; k++) {
        const ks_series *s = &job->in[k];
        gather[k] = s->sn != 1;
        fixed[k] = s->st == 0;
        if (gather[k] && fixed[k]) {
            const FT *p = (const FT *)s->ptr + n0 * s->sn;
            for (Py_ssize_t j = 0; j < nb; j++) buf[k * W + j] = p[j * s->sn];
        }
    }
    /* 1 / obs_var, once per tile when obs_var is constant in time, else once per step */
    FT *rho = buf + KS_NSERIES * W;
    const int obs_fixed = fixed[KS_OBS];
    int seen = 0;
    for (Py_ssize_t t = 0; t < T; t++) {
        for (int k = 0; k < KS_NSERIES; k++) {
            const ks_series *s = &job->in[k];
            const FT *p = (const FT *)s->ptr + t * s->st + n0 * s->sn;
            FT *b = buf + k * W;
            if (!gather[k]) {
                src[k] = p;
            } else {
                if (!fixed[k]) {
                    if (s->sn == 0) {
                        const FT v = p[0];
                        for (Py_ssize_t j = 0; j < nb; j++) b[j] = v;
                    } else {
                        for (Py_ssize_t j = 0; j < nb; j++) b[j] = p[j * s->sn];
                    }
                }
                src[k] = b;
            }
        }
        if (t == 0 || !obs_fixed) {
            const FT *restrict o = src[KS_OBS];
            for (Py_ssize_t j = 0; j < nb; j++) rho[j] = (FT)1 / o[j];
        }
        const Py_ssize_t row = t * N + n0;
        const int in = (int)(t & 1), out = 1 - in; /* state slots: read `in`, write `out` */
        FT *const lam_in = state + (2 * in) * W, *const eta_in = state + (2 * in + 1) * W;
        FT *const lam_out = state + (2 * out) * W, *const eta_out = state + (2 * out + 1) * W;
        FT *const o[KS_NOUT] = {
            (FT *)job->out[KS_LAM] + row,       (FT *)job->out[KS_ETA] + row,
            (FT *)job->out[KS_MEAN] + row,      (FT *)job->out[KS_VAR] + row,
            (FT *)job->out[KS_LAM_PRED] + row,  (FT *)job->out[KS_MEAN_PRED] + row,
            (FT *)job->out[KS_VAR_PRED] + row,
        };
#define KS_CALL(fn)                                                                                \
    fn(nb, src[KS_Z], src[KS_OBS], rho, src[KS_A], src[KS_P], src[KS_H], src[KS_C], lam_in,        \
       eta_in, acc + in * W, lam_out, eta_out, acc + out * W, o[KS_LAM], o[KS_ETA], o[KS_MEAN],    \
       o[KS_VAR], o[KS_LAM_PRED], o[KS_MEAN_PRED], o[KS_VAR_PRED])
        int flags = KS_CALL(KS_ROW);
        if (flags & KS_ROW_INEXACT) flags = (flags & KS_Z_INF) | KS_CALL(KS_ROW_EXACT);
#undef KS_CALL
        seen |= flags;
    }
    if (T & 1) /* the last step wrote into slot 1 */
        for (Py_ssize_t j = 0; j < nb; j++) acc[j] = acc[W + j];
    return seen & (KS_NOT_FINITE | KS_Z_INF);
}

#undef KS_ROW_ARGS
#undef KS_STEP
#undef KS_LANES
#undef KS_ROW_EXACT
#undef KS_ROW
#undef KS_CAT
#undef KS_CAT_
