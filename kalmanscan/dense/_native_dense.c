/* Native CPU path of kalmanscan.dense: the exact sequential filter and smoother in one pass over
 * time per series (kalmanscan/dense/native.py calls it; math in docs/dense.md, "Native path").
 *
 * Model of one series (n states, d observations, float64, matrices row-major):
 *
 *     x_t = F_t x_{t-1} + c_t + N(0, Q_t),   z_t = H_t x_t + N(0, R_t),   R_t, Q_t PSD (0 allowed)
 *     x_0 ~ N(m_0, P_0 + kappa D_0 D_0'),    kappa -> inf   (D_0 spans the diffuse directions)
 *
 * Filter: predict a = F m + c, P = F P F' + Q, D = F D (an orthonormal basis of its range instead
 * where its columns are of sizes far apart, at the rounding of their own product or dependent:
 * factor_basis, so a direction a tiny nonzero entry of F keeps stays diffuse and one F maps to 0
 * is forgotten); then the observed entries of z_t are
 * decorrelated with R_o = L Dg L' (L unit lower triangular, Dg >= 0: singular R is fine) and
 * processed one scalar at a time (Durbin & Koopman 2012, sec. 6.4). An entry with row h is
 * diffuse when u = D' h is nonzero relative to |h| |D|: then the exact initial update
 * (Koopman & Durbin 2000) is applied and D loses the direction u by a Householder reflection of
 * its columns, so the diffuse part stays an exact rank-k factor (no rounding residue left in
 * resolved directions, no threshold on a difference of covariances). Otherwise the ordinary
 * scalar update with f = h' P h + Dg_i; f = 0 (a noise-free entry already determined) carries no
 * information and is skipped.
 *
 * A large proper prior (native.py decides: its largest variance above 1e4 times the first step's
 * process variance) is carried the same way, P_0 = D_0 D_0' with P = 0 beside it (fin = 1): an
 * entry that sees D takes the exact update of P + D D' written so that no term of D's size is
 * subtracted, P <- P - (M M' + M m' + m M') / f + (f_s / f) m m' / nu^2 (M = P h, m = D u,
 * f_s = h' P h + Dg, nu = |u|, f = f_s + nu^2), and D loses the direction u as above; the factor
 * is folded into P once |D|_F^2 <= tr(P). The covariance form loses |P_pred| / |P_post| digits
 * per update, 1e18 with a 1e6 prior and an entry at R = 1e-12; here the loss is that of the
 * prior-free part only (docs/dense.md, "Native path"). A step with two or more near noise-free
 * entries (|h|^2 tr(P) > NEAR_STEP Dg, near_step) runs them on the factor of its predicted P the
 * same way (to_factor, then fold_factor): one at a time in covariance form the second would see
 * the first's rounding, |P| eps, next to a direction known to Dg. Under a large prior's factor
 * that happens when they observe the whole state (P_s and D then share one factor).
 *
 * Log-likelihood (kalmanscan's convention, docs/dense.md): proper entries add log N(v; 0, f);
 * a step with r diffuse entries adds 1/2 log pdet(2 pi G G') - sum 1/2 log(2 pi f_inf,i) over
 * them, G = H_o D, the pdet from the r largest singular values of G (one-sided Jacobi).
 *
 * Smoother: Durbin & Koopman's state smoother in univariate form (r, N; in diffuse steps also
 * r1, N1, N2), run backward from the stored predictions; the per-entry quantities of a step are
 * recomputed from its prediction instead of stored. Smoothed mean a + P r0 + P_inf r1, covariance
 * P - P N0 P - P_inf N1 P - (P_inf N1 P)' - P_inf N2 P_inf. Where that covariance cancels (a
 * large prior) and at the diffuse steps, the information J that z_{t:T} carry about x_t is carried
 * back instead (from the last step where the covariance form was accurate, until it is accurate
 * again; none from a step whose smoothed covariance is singular, a noise-free entry there: J is
 * infinite) and gives the smoothed covariance: at proper steps from the same information kept as
 * square-root rows (srif_*, below; (I + P J)^-1 P where they fail), at the diffuse steps in
 * square-root form G Lam^-1 G' (G = [L, D]), whenever that is well conditioned
 * (info_smoothed_cov). On a series with a diffuse start, a backward square-root
 * information filter (srif_*: Householder steps on [S | y]), its rows set at the first non-diffuse
 * step from r0 and N0 (srif_from_dk; from the end of the series where that conversion's
 * cond(I - N P) exceeds SRIF_COND) and carried back over the diffuse steps, serves the
 * diffuse steps' means and covariances (srif_smoothed). With an entry near noise-free
 * (|h|^2 |Q| / Dg > INFO_COND) the rows are run from the end instead (r0, N0 hold 1/Dg-sized
 * terms next to O(1) ones) and Durbin & Koopman's terms serve where they agree with the rows to
 * within the rows' error level (near_tol). A large prior's head (fin) takes its smoothed moments
 * from the same rows, run from the end, with x_t = a + L u + D v, u, v ~ N(0, I). A series with a
 * near_step step keeps the rows from the end over every step (rows_all): its proper steps' moments
 * are the rows' (k = 0) wherever Durbin & Koopman's P - P N P disagrees with them (near_tol);
 * their gains are recomputed on the same factor as in the filter.
 *
 * Precisions (filtered and smoothed) are inverses by Cholesky; a covariance that is not positive
 * definite gets NaN there and the caller inverts it by other means.
 */
#include "../core/_native_common.h" /* fused multiply-adds allowed (no KS_NO_FMA) */
#if defined(__GNUC__) && !defined(__clang__)
/* the vector forms' always-inline helpers pass 32-byte vectors; no call crosses an ABI */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define LOG_2PI 1.8378770664093454835606594728112
#define DIFFUSE_TOL 1e-11 /* |D'h| below this times |h| |D|_F: not a diffuse entry */
#define FACTOR_GRADE 0x1p-20 /* a predicted factor's columns further apart: a basis (factor_basis) */
#define FACTOR_SPAN 0x1p100  /* ... or one outside SPAN^-1 .. SPAN */
#define FADED_RES 0x1p-16 /* a diffuse column's part beyond the others' range below this: faded */
#define SKIP_TOL 1e-13    /* f below this times |h|^2 tr(P) with Dg = 0: an entry with no noise */
#define INFO_COND 1e4 /* |J| |Q| up to this along the carried J: the diffuse steps' info form */
#define SRIF_SWITCH 1e1 /* |P N P| up to this times |V|: r0, N0 set the square-root rows */
#define SRIF_COND 1e4 /* ... where cond(I - N P) is at most this (else the rows from the end) */
#define INFO_SWITCH 1e3 /* |P N P| above this times |V|: smoothed covariance in information form */
#define FIN_FOLD 1.0 /* |D|_F^2 up to this times tr(P): a large prior's factor folded into P */
#define NEAR_STEP 1e4 /* |h|^2 tr(P) above this times Dg: a near noise-free entry (near_step) */
#define WHOLE_RATIO 1e-4 /* a diffuse step observed whole: C = (W'W)^-1 up to this times tr(P) */

typedef struct {
    const double *p;
    Py_ssize_t sb, st, se; /* strides (elements) along series, time, and vector entry */
} arr_t;

enum { I_Z, I_F, I_C, I_Q, I_H, I_R, I_NIN };
enum {
    O_FMEAN, O_FCOV, O_FPREC, O_PMEAN, O_PCOV, O_LL, O_FLAG, O_PD, O_PK,
    O_SMEAN, O_SCOV, O_SPREC,
    O_NTERM, /* [B] the number of entries with a proper log-likelihood term (NULL: not written) */
    O_NOUT
};

typedef struct {
    int type; /* 0 skipped, 1 proper, 2 diffuse */
    double v, f, fs;
} elem_t;

/* The parts, in dependency order (one translation unit: every function stays static) */
#include "_native_dense_vec.h"    /* padded vector forms for 4 < n <= KS_VMAX */
#include "_native_dense_linalg.h" /* workspace and small dense matrix operations */
#include "_native_dense_update.h" /* the filter update of one step */
#include "_native_dense_sqrt.h"   /* square-root, information and factor forms */
#include "_native_dense_series.h" /* one series: filter and smoother */

/* run_series with the state dimension a compile-time constant for n <= 4 (small loops unrolled;
 * measured: the local linear trend's smoother 1.8x faster on 1000 series x 500 steps), any n
 * otherwise. */
#define KS_RUN_ARGS                                                                            \
    ws_t *w, const arr_t *in, double **out, const double *m0, const double *P0, const double *D0, \
        Py_ssize_t b, Py_ssize_t T, Py_ssize_t kcap, int smooth, int fin, Py_ssize_t *npred,    \
        Py_ssize_t *nbad
#define KS_RUN_PASS in, out, m0, P0, D0, b, T, kcap, smooth, fin, npred, nbad
#define KS_CASE(N) \
    KS_CLONES static Py_ssize_t run_n##N(KS_RUN_ARGS) { return run_series(w, N, KS_RUN_PASS); }
KS_CASE(1)
KS_CASE(2)
KS_CASE(3)
KS_CASE(4)
KS_CLONES static Py_ssize_t run_general(KS_RUN_ARGS) { return run_series(w, w->n, KS_RUN_PASS); }

static Py_ssize_t run_any(KS_RUN_ARGS) {
    switch (w->n) {
    case 1: return run_n1(w, KS_RUN_PASS);
    case 2: return run_n2(w, KS_RUN_PASS);
    case 3: return run_n3(w, KS_RUN_PASS);
    case 4: return run_n4(w, KS_RUN_PASS);
    default: return run_general(w, KS_RUN_PASS);
    }
}

static int parse_arr(PyObject *seq, Py_ssize_t i, arr_t *a) {
    PyObject *t = PySequence_GetItem(seq, i);
    if (!t) return 0;
    Py_ssize_t p, sb, st, se;
    int ok = PyArg_ParseTuple(t, "nnnn", &p, &sb, &st, &se);
    Py_DECREF(t);
    a->p = (const double *)p;
    a->sb = sb;
    a->st = st;
    a->se = se;
    return ok;
}

static PyObject *dense_run(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t B, T, n, d, kcap, pm0, pP0, pD0, pfin = 0;
    int smooth, fin;
    PyObject *ins, *outs;
    if (!PyArg_ParseTuple(args, "iinnnnnnnnOO|n", &smooth, &fin, &B, &T, &n, &d, &kcap, &pm0,
                          &pP0, &pD0, &ins, &outs, &pfin))
        return NULL;
    const unsigned char *fins = (const unsigned char *)pfin; /* per series fin, or NULL */
    arr_t in[I_NIN];
    for (int i = 0; i < I_NIN; i++)
        if (!parse_arr(ins, i, &in[i])) return NULL;
    double *out[O_NOUT];
    for (int i = 0; i < O_NOUT; i++) {
        PyObject *t = PySequence_GetItem(outs, i);
        if (!t) return NULL;
        out[i] = (double *)PyLong_AsSsize_t(t);
        Py_DECREF(t);
        if (PyErr_Occurred()) return NULL;
    }
    int nn = (int)(n * n), dd = (int)d;
    int big = nn > (int)(dd * n) ? nn : (int)(dd * n);
    size_t ndbl = (size_t)(3 * n + 7 * nn + 6 * big + 4 * dd + dd * dd + 2 * dd * n + 2 * n + 64 +
                           6 * nn + dd * n + n);
    double *buf = calloc(ndbl, sizeof(double));
    elem_t *el = calloc(dd + 1, sizeof(elem_t));
    int *ib = calloc((size_t)(dd + 1 + n + nn), sizeof(int));
    if (!buf || !el || !ib) {
        free(buf);
        free(el);
        free(ib);
        return PyErr_NoMemory();
    }
    ws_t w;
    w.n = (int)n;
    w.d = dd;
    w.zinf = 0;
    w.qcur = NULL;
    double *q = buf;
    w.m = q; q += n;
    w.u = q; q += n;
    w.w = q; q += n + 8;
    w.P = q; q += nn;
    w.D = q; q += nn;
    w.tmp = q; q += nn;
    w.tmp2 = q; q += 2 * n + 8;
    w.tmp2x = q; q += nn;
    w.Ms = q; q += n;
    w.Minf = q; q += n;
    w.fval = q; q += nn;
    w.G = q; q += big + 3 * n;
    w.Lr = q; q += big + dd * dd;
    w.Hy = q; q += dd * n;
    w.K0 = q; q += dd * n;
    w.K1 = q; q += dd * n;
    w.y = q; q += dd;
    w.Dg = q; q += dd;
    w.sig = q; q += n;
    w.a = q; q += n;
    w.xp = q; q += nn;
    w.xd = q; q += nn;
    w.xc = q; q += nn;
    w.xx = q; q += nn;
    w.xu = q; q += nn;
    w.xl = q; q += nn;
    w.xw = q; q += dd * n + n; /* o <= d rows of W */
    w.el = el;
    w.obs_idx = ib;
    w.fnz = ib + dd + 1;
    w.fcol = ib + dd + 1 + n;
    Py_ssize_t nd_max = 0, np_max = 0, err = 0, nbad = 0, nfaded = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < B; b++) {
        Py_ssize_t npred = 0;
        Py_ssize_t nd = run_any(&w, in, out, (const double *)pm0 + b * n,
                                   (const double *)pP0 + b * nn, (const double *)pD0 + b * nn, b,
                                   T, kcap, smooth, fins ? (int)fins[b] : fin, &npred, &nbad);
        if (nd < 0) err = 1;
        nfaded += w.faded;
        if (nd > nd_max) nd_max = nd;
        if (npred > np_max) np_max = npred;
    }
    Py_END_ALLOW_THREADS
    free(buf);
    free(el);
    free(ib);
    if (err) return PyErr_NoMemory();
    return Py_BuildValue("nnnin", nd_max, np_max, nbad, w.zinf, nfaded);
}

static PyMethodDef methods[] = {
    {"run", dense_run, METH_VARARGS,
     "run(smooth, fin, B, T, n, d, kcap, m0, P0, D0, inputs, outputs[, fins]) -> (ndiffuse, npred_head, nbad, z_has_inf); smooth = -1: the log-likelihood output alone (and the term count); fin = 1: D0 factors a large proper prior; fins: address of a uint8 [B] fin per series (0: fin for all)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native_dense",
                                    "Native sequential dense filter and smoother (float64).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__native_dense(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    ks_vec_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    ks_vec_ok = 1;
#endif
    if (getenv("KALMANSCAN_DENSE_SCALAR")) ks_vec_ok = 0; /* tests: the scalar forms */
#ifdef KS_HAVE_512
    ks_has_512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("fma");
    if (getenv("KALMANSCAN_NO_AVX512")) ks_has_512 = 0; /* tests: the four-double forms */
#endif
    return PyModule_Create(&module);
}
