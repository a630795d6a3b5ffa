/* The native CPU backend of kalmanscan.filter: one fused pass over time per block of lanes.
 *
 * For every step t and lane n it computes what kalmanscan/core/filter.py's `_run_block` returns
 * (filtered precision lam and information eta, filtered mean/var, one-step prior precision, mean,
 * variance, and the per-lane log-likelihood with the exact diffuse convention), with the formulas of
 * kalmanscan/core/steps.py and kalmanscan/core/sequential.py:
 *
 *     q = (a*a == 0), d = q ? p : a*a                  (a = decay, p = process_var)
 *     lam_pred = (lam + q) / (d + p*lam),  alpha = q ? 0 : a / (d + p*lam)
 *     eta_pred = alpha*eta + lam_pred*c                 (c = offset)
 *     observed = z is not NaN and obs_var is not inf
 *     lam = lam_pred + (observed ? h*h/obs_var : 0),  eta = eta_pred + (observed ? h*z/obs_var : 0)
 *     loglik += observed and (lam_pred > 0 or h == 0) ? log N(z; h*mean_pred, h^2 var_pred + obs_var) : 0
 *
 * Layout: outputs are row-major [T, N]; parameters are read through (time, lane) element strides, so
 * stride 0 broadcasts a parameter along that axis without materializing it. Time is the outer loop
 * and a tile of contiguous lanes the inner one, so the compiler vectorizes across lanes; parameters
 * whose lane stride is not 1 are gathered into a small tile buffer first (once per tile when they
 * are also constant in time). Lane ranges run on worker threads with the GIL released.
 *
 * Inputs are assumed valid (kalmanscan/core/_args.py checks them at the public boundary), except
 * that the check of z for infinities is done here, in the same pass (flag KS_Z_INF); a non-finite
 * filtered precision or information (overflow) is flagged too. The caller raises for both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef _WIN32
#include <pthread.h>
#define KS_HAVE_PTHREADS 1
#endif

/* Build one copy of the kernels per x86-64 level and pick at load time (GNU ifunc). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    (__GNUC__ >= 11)
#define KS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KS_CLONES
#endif

#define KS_TILE 1024 /* default lanes per tile (buffers stay in L2) */
#define KS_MIN_TILE 8 /* tiles narrower than this run lane by lane, time inner */

/* Flags of the kernel's result (bits). */
#define KS_NOT_FINITE 1  /* a filtered precision or information is not finite (overflow) */
#define KS_Z_INF 2       /* z holds +-inf (invalid input; the caller raises) */
#define KS_ROW_INEXACT 4 /* internal: recompute a row with the division forms */
#define KS_NO_MEMORY 8   /* a worker could not allocate its tile buffers */
#define KS_LOG_2PI 1.8378770664093454835606594728112

enum { KS_Z, KS_OBS, KS_A, KS_P, KS_H, KS_C, KS_NSERIES };
enum { KS_LAM, KS_ETA, KS_MEAN, KS_VAR, KS_LAM_PRED, KS_MEAN_PRED, KS_VAR_PRED, KS_NOUT };

typedef struct {
    const char *ptr;   /* element (0, 0) */
    Py_ssize_t st, sn; /* element strides along time and lanes */
} ks_series;

typedef struct {
    int is_double;
    Py_ssize_t T, N;
    ks_series in[KS_NSERIES];
    const char *lam0, *eta0;
    Py_ssize_t lam0_sn, eta0_sn;
    char *out[KS_NOUT]; /* contiguous [T, N] */
    char *loglik;       /* contiguous [N] */
    Py_ssize_t n_lo, n_hi;
    Py_ssize_t tile; /* lanes per tile */
    int flags; /* KS_NOT_FINITE | KS_Z_INF */
} ks_job;

/* Natural logarithm written so that it vectorizes (fdlibm's e_log.c reduction and polynomial,
 * < 1 ulp over the normal range). x must be > 0 (NaN is not expected); inf gives inf; subnormals
 * are scaled first. */
static inline double ks_log(double x) {
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double Lg1 = 6.666666666666735130e-01, Lg2 = 3.999999999940941908e-01,
                 Lg3 = 2.857142874366239149e-01, Lg4 = 2.222219843214978396e-01,
                 Lg5 = 1.818357216161805012e-01, Lg6 = 1.531383769920937332e-01,
                 Lg7 = 1.479819860511658591e-01;
    int tiny = x < DBL_MIN;
    double xs = tiny ? x * 18014398509481984.0 /* 2^54 */ : x;
    uint64_t u;
    memcpy(&u, &xs, 8);
    uint64_t hx = u >> 32;
    uint64_t e = hx >> 20; /* biased exponent (x > 0: no sign bit) */
    hx &= 0xfffffu;
    uint64_t i = (hx + 0x95f64u) & 0x100000u; /* 1 where the mantissa is >= sqrt(2) */
    u = ((hx | (i ^ 0x3ff00000u)) << 32) | (u & 0xffffffffu);
    double m;
    memcpy(&m, &u, 8); /* in [sqrt(2)/2, sqrt(2)) */
    uint64_t kb = 0x4330000000000000u | (e + (i >> 20));
    double dk;
    memcpy(&dk, &kb, 8);
    dk = dk - 4503599627370496.0 - 1023.0 - (tiny ? 54.0 : 0.0);
    double f = m - 1.0;
    double s = f / (2.0 + f);
    double z = s * s, w = z * z;
    double t1 = w * (Lg2 + w * (Lg4 + w * Lg6));
    double t2 = z * (Lg1 + w * (Lg3 + w * (Lg5 + w * Lg7)));
    double R = t2 + t1;
    double hfsq = 0.5 * f * f;
    double r = dk * ln2_hi - ((hfsq - (s * (hfsq + R) + dk * ln2_lo)) - f);
    return x <= DBL_MAX ? r : x;
}

#define KS_FT double
#define KS_FT_MIN DBL_MIN
#define KS_FT_MAX DBL_MAX
#define KS_NAME ks_tile_f64
#include "_native_kernel.h"
#undef KS_FT
#undef KS_FT_MIN
#undef KS_FT_MAX
#undef KS_NAME

#define KS_FT float
#define KS_FT_MIN FLT_MIN
#define KS_FT_MAX FLT_MAX
#define KS_NAME ks_tile_f32
#include "_native_kernel.h"
#undef KS_FT
#undef KS_FT_MIN
#undef KS_FT_MAX
#undef KS_NAME

static void *ks_run_job(void *arg) {
    ks_job *job = (ks_job *)arg;
    const Py_ssize_t W = job->tile;
    /* per tile: state (lam, eta) and log-likelihood, each twice (in, out); one gather buffer per
     * parameter series and one for 1 / obs_var */
    double *acc = (double *)malloc(sizeof(double) * 2 * W);
    double *work = (double *)malloc(sizeof(double) * (4 + KS_NSERIES + 1) * W);
    if (acc == NULL || work == NULL) {
        free(acc);
        free(work);
        job->flags = KS_NO_MEMORY;
        return NULL;
    }
    /* tiles of equal width (at most W), so that no narrow remainder tile is left over */
    const Py_ssize_t n = job->n_hi - job->n_lo, tiles = (n + W - 1) / W;
    const Py_ssize_t step = (n + tiles - 1) / tiles;
    int flags = 0;
    for (Py_ssize_t n0 = job->n_lo; n0 < job->n_hi; n0 += step) {
        Py_ssize_t nb = job->n_hi - n0 < step ? job->n_hi - n0 : step;
        for (Py_ssize_t j = 0; j < nb; j++) acc[j] = 0.0;
        if (nb < KS_MIN_TILE) { /* too few lanes to vectorize: one lane at a time */
            flags |= job->is_double ? ks_tile_f64_lanes(job, n0, nb, acc)
                                    : ks_tile_f32_lanes(job, n0, nb, acc);
            for (Py_ssize_t j = 0; j < nb; j++) {
                if (job->is_double)
                    ((double *)job->loglik)[n0 + j] = acc[j];
                else
                    ((float *)job->loglik)[n0 + j] = (float)acc[j];
            }
        } else if (job->is_double) {
            double *state = work, *buf = work + 4 * W;
            const double *l0 = (const double *)job->lam0, *e0 = (const double *)job->eta0;
            for (Py_ssize_t j = 0; j < nb; j++) {
                state[j] = l0[(n0 + j) * job->lam0_sn];
                state[W + j] = e0[(n0 + j) * job->eta0_sn];
            }
            flags |= ks_tile_f64(job, n0, nb, state, acc, buf);
            double *ll = (double *)job->loglik + n0;
            for (Py_ssize_t j = 0; j < nb; j++) ll[j] = acc[j];
        } else {
            float *state = (float *)work, *buf = (float *)work + 4 * W;
            const float *l0 = (const float *)job->lam0, *e0 = (const float *)job->eta0;
            for (Py_ssize_t j = 0; j < nb; j++) {
                state[j] = l0[(n0 + j) * job->lam0_sn];
                state[W + j] = e0[(n0 + j) * job->eta0_sn];
            }
            flags |= ks_tile_f32(job, n0, nb, state, acc, buf);
            float *ll = (float *)job->loglik + n0;
            for (Py_ssize_t j = 0; j < nb; j++) ll[j] = (float)acc[j];
        }
    }
    free(acc);
    free(work);
    job->flags = flags;
    return NULL;
}

#define KS_MAX_THREADS 64

static int parse_series(PyObject *obj, ks_series *s, const char *what) {
    unsigned long long ptr;
    if (!PyArg_ParseTuple(obj, "Knn", &ptr, &s->st, &s->sn)) {
        PyErr_Format(PyExc_TypeError, "%s: expected (address, time stride, lane stride)", what);
        return 0;
    }
    s->ptr = (const char *)(uintptr_t)ptr;
    return 1;
}

PyDoc_STRVAR(filter_doc,
             "filter(is_double, T, N, threads, series, lam0, eta0, outputs, loglik) -> int\n\n"
             "Fused filter pass over [T, N] lanes (addresses and element strides; see native.py).\n"
             "series: 6 tuples (address, time stride, lane stride) for z, obs_var, decay,\n"
             "process_var, loading, offset; lam0, eta0: (address, lane stride); outputs: 7\n"
             "addresses of contiguous [T, N] arrays (lam, eta, mean, var, lam_pred, mean_pred,\n"
             "var_pred); loglik: address of a contiguous [N] array. Returns flags: 1 when a\n"
             "filtered precision or information is not finite, 2 when z holds an infinity.");

static PyObject *ks_filter(PyObject *self, PyObject *args) {
    (void)self;
    int is_double, threads;
    Py_ssize_t tile = 0;
    Py_ssize_t T, N;
    PyObject *series, *outputs;
    unsigned long long lam0, eta0, loglik;
    Py_ssize_t lam0_sn, eta0_sn;
    if (!PyArg_ParseTuple(args, "pnniO!(Kn)(Kn)O!K|n", &is_double, &T, &N, &threads,
                          &PyTuple_Type, &series, &lam0, &lam0_sn, &eta0, &eta0_sn, &PyTuple_Type,
                          &outputs, &loglik, &tile))
        return NULL;
    if (PyTuple_GET_SIZE(series) != KS_NSERIES || PyTuple_GET_SIZE(outputs) != KS_NOUT) {
        PyErr_SetString(PyExc_TypeError, "series, outputs: expected 6 and 7 entries");
        return NULL;
    }
    if (T < 1 || N < 1) {
        PyErr_SetString(PyExc_ValueError, "T, N: expected positive sizes");
        return NULL;
    }
    ks_job base;
    memset(&base, 0, sizeof base);
    base.is_double = is_double;
    base.T = T;
    base.N = N;
    for (int k = 0; k < KS_NSERIES; k++)
        if (!parse_series(PyTuple_GET_ITEM(series, k), &base.in[k], "series")) return NULL;
    for (int k = 0; k < KS_NOUT; k++) {
        unsigned long long p = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(outputs, k));
        if (PyErr_Occurred()) return NULL;
        base.out[k] = (char *)(uintptr_t)p;
    }
    base.lam0 = (const char *)(uintptr_t)lam0;
    base.eta0 = (const char *)(uintptr_t)eta0;
    base.lam0_sn = lam0_sn;
    base.eta0_sn = eta0_sn;
    base.loglik = (char *)(uintptr_t)loglik;

    /* Lane ranges of whole cache lines (16 float32 / 8 float64 lanes) per thread. */
    Py_ssize_t align = is_double ? 8 : 16;
    if (threads < 1) threads = 1;
    if (threads > KS_MAX_THREADS) threads = KS_MAX_THREADS;
    if ((Py_ssize_t)threads > (N + align - 1) / align) threads = (int)((N + align - 1) / align);
    if (tile < 1) tile = KS_TILE;
    base.tile = tile;
    ks_job jobs[KS_MAX_THREADS];
    Py_ssize_t per = ((N + threads - 1) / threads + align - 1) / align * align;
    int njobs = 0;
    for (Py_ssize_t lo = 0; lo < N && njobs < threads; lo += per) {
        jobs[njobs] = base;
        jobs[njobs].n_lo = lo;
        jobs[njobs].n_hi = lo + per < N ? lo + per : N;
        njobs++;
    }
    int flags = 0;
    Py_BEGIN_ALLOW_THREADS
#ifdef KS_HAVE_PTHREADS
    pthread_t tid[KS_MAX_THREADS];
    int started[KS_MAX_THREADS] = {0};
    for (int k = 1; k < njobs; k++) started[k] = pthread_create(&tid[k], NULL, ks_run_job, &jobs[k]) == 0;
    ks_run_job(&jobs[0]);
    for (int k = 1; k < njobs; k++) {
        if (started[k])
            pthread_join(tid[k], NULL);
        else
            ks_run_job(&jobs[k]); /* no thread available: run it here */
    }
#else
    for (int k = 0; k < njobs; k++) ks_run_job(&jobs[k]);
#endif
    for (int k = 0; k < njobs; k++) flags |= jobs[k].flags;
    Py_END_ALLOW_THREADS
    if (flags & KS_NO_MEMORY) return PyErr_NoMemory();
    return PyLong_FromLong(flags);
}

static PyMethodDef ks_methods[] = {
    {"filter", ks_filter, METH_VARARGS, filter_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ks_module = {
    PyModuleDef_HEAD_INIT, "_native",
    "Fused single-pass CPU kernel of kalmanscan.filter (see kalmanscan/core/native.py).", -1,
    ks_methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&ks_module); }
