/* The native CPU backend: the filter, the smoother and the log-likelihood's adjoint of
 * docs/backend-contract.md, one fused pass over time per tile of lanes.
 *
 * Beliefs are homogeneous triples (u, e, v) (precision u/v, mean e/u): a diffuse state (0, 0, 1)
 * and a state known exactly (1, m, 0) are ordinary values, so nothing overflows on a valid model.
 * The filter's recursion scales the triple by a power of two each step (exact, no division on the
 * recursion's path: max(u, v) in [1, 2)); the contract's max(u, v) = 1 holds for the final state
 * and for the steps redone exactly. One step (a decay, p process_var, c offset, h loading,
 * R obs_var; forget where a == 0; a diffuse state, u = 0, stays diffuse where a*a underflows):
 *
 *     predict  (u, e, v) -> (u + q v, c (u + q v) + a (1 - q) e, p u + d v) / max
 *              q = forget, d = forget ? p : a*a
 *     update   (u, e, v) -> (R u + h^2 v, R e + h z v, R v) / max      where z is observed
 *     loglik   -0.5 (log 2 pi + log(S'/u-) + (z u- - h e-)^2 / (u- S')),  S' = h^2 v- + R u-
 *
 * (the update is the contract's (u + phi v, e + r v, v) times R; where one of its products passes
 * the range though the updated belief does not, obs_var 1e300 times a mean of 1e10, the steps
 * redone exactly and the smoother form it in a power-of-two scaling). The smoother adds a backward
 * information filter (two-filter form) reading the filtered outputs back; the adjoint
 * (_native_adjoint.h) differentiates the log-likelihood by one reverse pass with checkpoints
 * (float64: the steps whose variances pass 2^64 or whose values leave the range in a wide form).
 *
 * Layout: outputs are row-major [T, N]; inputs are read through (time, lane) element strides, so
 * stride 0 broadcasts a parameter along that axis without materializing it. Time is the outer
 * loop and a tile of contiguous lanes the inner one, so the compiler vectorizes across lanes.
 * Tiles are handed out one at a time to the calling thread and to a persistent pool of worker
 * threads (GIL released), so a worker held up by other load on its core delays a call by at most
 * the tile it holds, and the caller never waits for a worker that has not started.
 *
 * The filter checks its inputs' ranges in the same pass (flag KS_BAD_INPUT; the caller then finds
 * and names the bad value) and reports z = +-inf as KS_Z_INF; a state, log-likelihood or gradient
 * that is not finite is flagged KS_NOT_FINITE. The adjoint assumes inputs the filter accepted.
 */
#define KS_NO_FMA /* results are bit-identical for any split of lanes over tiles and threads */
#include "_native_common.h"

#ifdef KS_HAVE_PTHREADS
#include <sys/mman.h>
#include <unistd.h>
#endif

#define KS_TILE 1024     /* most lanes per tile of the filter (buffers stay in L2) */
#define KS_ADJ_TILE 256  /* most lanes per tile of the adjoint (its checkpoints stay in L2) */
#define KS_MIN_TILE 8    /* tiles narrower than this run lane by lane, time inner */

/* Flags of a result (bits). */
#define KS_NOT_FINITE 1  /* a value that must be finite is not: data no float can hold */
#define KS_Z_INF 2       /* z holds +-inf (invalid input; the caller raises) */
#define KS_BAD_INPUT 4    /* an input is out of its range (filter._validate's ranges) */
#define KS_LL_LOST 8      /* a predicted precision below the normal range: its lane's loglik NaN */
#define KS_ROW_INEXACT 16 /* internal: redo a step with divisions */
#define KS_NO_MEMORY 32   /* a thread could not allocate its tile buffers */
#define KS_TINY_DECAY 64  /* internal: a step's decays hold one whose square is below the range */
#define KS_LOG_2PI 1.8378770664093454835606594728112

#define KS_CAT_(a, b) a##b
#define KS_CAT(a, b) KS_CAT_(a, b)

enum { KS_Z, KS_OBS, KS_A, KS_P, KS_H, KS_C, KS_NSERIES };
enum { KS_MEAN, KS_VAR, KS_PREC, KS_INFO, KS_PMEAN, KS_PVAR, KS_PPREC, KS_NOUT };

typedef struct {
    const char *ptr;   /* element (0, 0) */
    Py_ssize_t st, sn; /* element strides along time and lanes */
} ks_series;

typedef struct {
    Py_ssize_t T, N;
    ks_series in[KS_NSERIES];
    const char *x0[3]; /* u0, e0, v0 */
    Py_ssize_t x0_sn[3];
    char *out[KS_NOUT]; /* contiguous [T, N], or all NULL (log-likelihood only) */
    char *smooth[2];    /* smooth_mean, smooth_var: contiguous [T, N], or NULL */
    char *loglik;       /* [N] */
    char *final[3];     /* [N] each */
} ks_job;

typedef struct {
    char *ptr;          /* NULL: not asked for */
    int full_t, full_n; /* the gradient's compact shape: [T or 1, N or 1], contiguous */
} ks_grad;

typedef struct {
    ks_job fwd;
    Py_ssize_t K; /* steps between checkpoints */
    const char *w;
    Py_ssize_t w_sn;
    ks_grad grad[KS_NSERIES];
    char *gx0[3];
    double *tsum; /* [workers, KS_NSERIES, T]: per-thread sums over lanes of [T, 1] gradients */
    double *ssum; /* [workers, KS_NSERIES]: per-thread sums of [1, 1] gradients */
} ks_adj_job;

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
#define KS_FT_TRUE_MIN DBL_TRUE_MIN
#define KS_SAFE_MIN 0x1p-300 /* the fast form's range of an unnormalized predicted triple */
#define KS_SAFE_MAX 0x1p+300
#define KS_UINT uint64_t
#define KS_EXP_MASK 0x7ff0000000000000u
#define KS_EXP_TWICE_BIAS 0x7fe0000000000000u /* twice the exponent bias, in the field */
#define KS_NAME ks_f64
#include "_native_instance.h"

#define KS_FT float
#define KS_FT_MIN FLT_MIN
#define KS_FT_MAX FLT_MAX
#define KS_FT_TRUE_MIN FLT_TRUE_MIN
#define KS_SAFE_MIN 0x1p-60f
#define KS_SAFE_MAX 0x1p+60f
#define KS_UINT uint32_t
#define KS_EXP_MASK 0x7f800000u
#define KS_EXP_TWICE_BIAS 0x7f000000u
#define KS_NAME ks_f32
#include "_native_instance.h"

/* ------------------------------------------------------------------------------------------------
 * Work splitting: a task is nchunks chunks of lanes; the calling thread and up to `threads - 1`
 * pool workers take chunks from a shared counter until none is left. The caller waits only for
 * workers that took part (a worker that wakes after the caller closed the task does nothing). */

typedef int (*ks_chunk_fn)(void *ctx, Py_ssize_t chunk, int worker);

typedef struct {
    ks_chunk_fn fn;
    void *ctx;
    Py_ssize_t nchunks;
    Py_ssize_t next; /* atomic: the next chunk to take */
    int flags;       /* atomic OR of the chunks' flags */
} ks_task;

/* Per-thread scratch, grown as needed and kept for the thread's life (no allocation per chunk). */
static __thread double *ks_scratch_ptr = NULL;
static __thread size_t ks_scratch_len = 0;

static double *ks_scratch(size_t n) {
    if (n > ks_scratch_len) {
        free(ks_scratch_ptr);
        ks_scratch_ptr = (double *)malloc(n * sizeof(double));
        ks_scratch_len = ks_scratch_ptr ? n : 0;
    }
    return ks_scratch_ptr;
}

static void ks_run_chunks(ks_task *task, int worker) {
    int flags = 0;
    for (;;) {
        const Py_ssize_t k = __atomic_fetch_add(&task->next, 1, __ATOMIC_RELAXED);
        if (k >= task->nchunks) break;
        flags |= task->fn(task->ctx, k, worker);
    }
    __atomic_fetch_or(&task->flags, flags, __ATOMIC_RELAXED);
}

#ifdef KS_HAVE_PTHREADS
static pthread_mutex_t ks_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ks_pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t ks_pool_idle = PTHREAD_COND_INITIALIZER;
static int ks_pool_size = 0;             /* workers started */
static unsigned long ks_pool_gen = 0;    /* bumped per task */
static ks_task *ks_pool_task = NULL;     /* the open task, NULL when none */
static int ks_pool_seats = 0;            /* workers that may still join the open task */
static int ks_pool_active = 0;           /* workers inside a task */
static int ks_pool_busy = 0;             /* a caller owns the pool */
static int ks_pool_atfork = 0;

static void *ks_worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&ks_pool_mu);
    unsigned long seen = ks_pool_gen;
    for (;;) {
        while (ks_pool_gen == seen) pthread_cond_wait(&ks_pool_wake, &ks_pool_mu);
        seen = ks_pool_gen;
        if (ks_pool_task == NULL || ks_pool_seats == 0) continue;
        ks_task *task = ks_pool_task;
        const int slot = ks_pool_seats--; /* worker slots 1 .. threads - 1 */
        ks_pool_active++;
        pthread_mutex_unlock(&ks_pool_mu);
        ks_run_chunks(task, slot);
        pthread_mutex_lock(&ks_pool_mu);
        if (--ks_pool_active == 0) pthread_cond_signal(&ks_pool_idle);
    }
    return NULL;
}

/* After fork() the child has none of the parent's workers. */
static void ks_pool_after_fork(void) {
    pthread_mutex_init(&ks_pool_mu, NULL);
    pthread_cond_init(&ks_pool_wake, NULL);
    pthread_cond_init(&ks_pool_idle, NULL);
    ks_pool_size = 0;
    ks_pool_task = NULL;
    ks_pool_seats = 0;
    ks_pool_active = 0;
    ks_pool_busy = 0;
}
#endif

/* Run a task on `threads` threads (the caller included); returns the OR of its flags. */
static int ks_parallel(ks_task *task, int threads) {
    task->next = 0;
    task->flags = 0;
    if (threads > task->nchunks) threads = (int)task->nchunks;
#ifdef KS_HAVE_PTHREADS
    if (threads > 1) {
        pthread_mutex_lock(&ks_pool_mu);
        if (ks_pool_busy) { /* another Python thread's call holds the pool: run here alone */
            pthread_mutex_unlock(&ks_pool_mu);
            ks_run_chunks(task, 0);
            return task->flags;
        }
        if (!ks_pool_atfork) {
            pthread_atfork(NULL, NULL, ks_pool_after_fork);
            ks_pool_atfork = 1;
        }
        while (ks_pool_size < threads - 1 && ks_pool_size < KS_MAX_THREADS - 1) {
            pthread_t tid;
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            const int ok = pthread_create(&tid, &attr, ks_worker, NULL) == 0;
            pthread_attr_destroy(&attr);
            if (!ok) break;
            ks_pool_size++;
        }
        if (threads - 1 > ks_pool_size) threads = ks_pool_size + 1;
        ks_pool_busy = 1;
        ks_pool_task = task;
        ks_pool_seats = threads - 1;
        ks_pool_gen++;
        pthread_cond_broadcast(&ks_pool_wake);
        pthread_mutex_unlock(&ks_pool_mu);
        ks_run_chunks(task, 0);
        pthread_mutex_lock(&ks_pool_mu);
        ks_pool_task = NULL; /* close the task: late workers skip it */
        ks_pool_seats = 0;
        while (ks_pool_active > 0) pthread_cond_wait(&ks_pool_idle, &ks_pool_mu);
        ks_pool_busy = 0;
        pthread_mutex_unlock(&ks_pool_mu);
        return __atomic_load_n(&task->flags, __ATOMIC_RELAXED);
    }
#else
    (void)threads;
#endif
    ks_run_chunks(task, 0);
    return task->flags;
}

/* Chunks of lanes for `threads` threads: about `per_thread` each, at most `most` lanes, at least
 * 64, widths a multiple of 16 lanes (whole cache lines of every output row, so that two threads
 * never write the same line). Wide chunks matter for the filter's outputs: with 63-lane chunks
 * (8 a thread) writing all outputs of 1000 x 2000 took 2.5x as long as with 250-lane ones. */
static Py_ssize_t ks_chunk_width(Py_ssize_t N, int threads, Py_ssize_t most, int per_thread) {
    if (threads <= 1) return N < most ? N : most;
    Py_ssize_t want = (N + (Py_ssize_t)threads * per_thread - 1) / ((Py_ssize_t)threads * per_thread);
    if (want < 64) want = 64;
    want = (want + 15) / 16 * 16;
    return want < most ? want : most;
}

/* ------------------------------------------------------------------------------------------------
 * The filter / smoother task. */

typedef struct {
    ks_job job;
    int is_double;
    Py_ssize_t width; /* lanes per chunk */
} ks_filter_ctx;

static int ks_filter_chunk(void *arg, Py_ssize_t chunk, int worker) {
    (void)worker;
    const ks_filter_ctx *ctx = (const ks_filter_ctx *)arg;
    const ks_job *job = &ctx->job;
    const Py_ssize_t n0 = chunk * ctx->width;
    const Py_ssize_t nb = job->N - n0 < ctx->width ? job->N - n0 : ctx->width;
    if (nb < KS_MIN_TILE)
        return ctx->is_double ? ks_f64_lanes(job, n0, nb) : ks_f32_lanes(job, n0, nb);
    const Py_ssize_t W = ctx->width;
    double *s = ks_scratch((size_t)W * (2 + 6 + KS_NSERIES));
    if (s == NULL) return KS_NO_MEMORY;
    return ctx->is_double ? ks_f64_tile(job, n0, nb, W, s + 2 * W, s)
                          : ks_f32_tile(job, n0, nb, W, (float *)(s + 2 * W), s);
}

static int parse_series(PyObject *obj, ks_series *s) {
    unsigned long long ptr;
    if (!PyTuple_Check(obj) || !PyArg_ParseTuple(obj, "Knn", &ptr, &s->st, &s->sn)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError,
                        "series: expected tuples (address, time stride, lane stride)");
        return 0;
    }
    s->ptr = (const char *)(uintptr_t)ptr;
    return 1;
}

static int parse_addresses(PyObject *tup, Py_ssize_t n, char **out, const char *what) {
    if (!PyTuple_Check(tup) || (PyTuple_GET_SIZE(tup) != n && PyTuple_GET_SIZE(tup) != 0)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a tuple of %zd addresses or ()", what, n);
        return 0;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (PyTuple_GET_SIZE(tup) == 0) {
            out[k] = NULL;
            continue;
        }
        unsigned long long p = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(tup, k));
        if (PyErr_Occurred()) return 0;
        out[k] = (char *)(uintptr_t)p;
    }
    return 1;
}

/* The job's common arguments: series (6 tuples), x0 (3 tuples (address, lane stride)). */
static int parse_job(ks_job *job, Py_ssize_t T, Py_ssize_t N, PyObject *series, PyObject *x0) {
    memset(job, 0, sizeof *job);
    job->T = T;
    job->N = N;
    if (T < 1 || N < 1) {
        PyErr_Format(PyExc_ValueError, "T, N: expected positive sizes, got %zd, %zd", T, N);
        return 0;
    }
    if (!PyTuple_Check(series) || PyTuple_GET_SIZE(series) != KS_NSERIES || !PyTuple_Check(x0) ||
        PyTuple_GET_SIZE(x0) != 3) {
        PyErr_SetString(PyExc_TypeError, "series, x0: expected tuples of 6 and 3 entries");
        return 0;
    }
    for (int k = 0; k < KS_NSERIES; k++)
        if (!parse_series(PyTuple_GET_ITEM(series, k), &job->in[k])) return 0;
    for (int k = 0; k < 3; k++) {
        unsigned long long p;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(x0, k), "Kn", &p, &job->x0_sn[k])) return 0;
        job->x0[k] = (const char *)(uintptr_t)p;
    }
    return 1;
}

PyDoc_STRVAR(filter_doc,
             "filter(is_double, T, N, threads, series, x0, outputs, smooth, loglik, final) -> int\n\n"
             "Filter (and smooth) [T, N] lanes (addresses and element strides; see native.py).\n"
             "series: 6 tuples (address, time stride, lane stride) for z, obs_var, decay,\n"
             "process_var, loading, offset; x0: 3 tuples (address, lane stride) for u0, e0, v0;\n"
             "outputs: 7 addresses of contiguous [T, N] arrays (mean, var, precision, info,\n"
             "pred_mean, pred_var, pred_precision) or () for the log-likelihood only; smooth: 2\n"
             "addresses (smooth_mean, smooth_var) or (); loglik: address of [N]; final: 3\n"
             "addresses of [N] (u, e, v). Returns flags: 1 a value is not finite, 2 z holds inf.");

static PyObject *ks_filter(PyObject *self, PyObject *args) {
    (void)self;
    int is_double, threads;
    Py_ssize_t T, N;
    PyObject *series, *x0, *outputs, *smooth, *final;
    unsigned long long loglik;
    if (!PyArg_ParseTuple(args, "pnniOOOOKO", &is_double, &T, &N, &threads, &series, &x0,
                          &outputs, &smooth, &loglik, &final))
        return NULL;
    ks_filter_ctx ctx;
    if (!parse_job(&ctx.job, T, N, series, x0)) return NULL;
    if (!parse_addresses(outputs, KS_NOUT, ctx.job.out, "outputs") ||
        !parse_addresses(smooth, 2, ctx.job.smooth, "smooth") ||
        !parse_addresses(final, 3, ctx.job.final, "final"))
        return NULL;
    if (ctx.job.smooth[0] != NULL && ctx.job.out[0] == NULL) {
        PyErr_SetString(PyExc_ValueError, "smooth: needs the 7 filter outputs too");
        return NULL;
    }
    if (ctx.job.final[0] == NULL) {
        PyErr_SetString(PyExc_ValueError, "final: expected 3 addresses, got ()");
        return NULL;
    }
    ctx.job.loglik = (char *)(uintptr_t)loglik;
    ctx.is_double = is_double;
    if (threads < 1) threads = 1;
    if (threads > KS_MAX_THREADS) threads = KS_MAX_THREADS;
    ctx.width = ks_chunk_width(N, threads, KS_TILE, 2);
    ks_task task = {ks_filter_chunk, &ctx, (N + ctx.width - 1) / ctx.width, 0, 0};
    int flags;
    Py_BEGIN_ALLOW_THREADS flags = ks_parallel(&task, threads);
    Py_END_ALLOW_THREADS if (flags & KS_NO_MEMORY) return PyErr_NoMemory();
    return PyLong_FromLong(flags);
}

/* ------------------------------------------------------------------------------------------------
 * The adjoint task. */

typedef struct {
    ks_adj_job aj;
    int is_double;
    Py_ssize_t width;
} ks_adj_ctx;

static int ks_adj_chunk(void *arg, Py_ssize_t chunk, int worker) {
    const ks_adj_ctx *ctx = (const ks_adj_ctx *)arg;
    const ks_job *job = &ctx->aj.fwd;
    const Py_ssize_t W = ctx->width, n0 = chunk * W;
    const Py_ssize_t nb = job->N - n0 < W ? job->N - n0 : W;
    const size_t need = ctx->is_double ? ks_f64_adj_scratch(job->T, ctx->aj.K, W)
                                       : ks_f32_adj_scratch(job->T, ctx->aj.K, W);
    double *s = ks_scratch(need);
    if (s == NULL) return KS_NO_MEMORY;
    return ctx->is_double ? ks_f64_adjoint(&ctx->aj, n0, nb, W, s, worker)
                          : ks_f32_adjoint(&ctx->aj, n0, nb, W, s, worker);
}

PyDoc_STRVAR(adjoint_doc,
             "loglik_grad(is_double, T, N, threads, series, x0, w, grads, grad_x0, K) -> int\n\n"
             "Gradient of sum_n w[n] loglik[n] with respect to the inputs, by one reverse pass\n"
             "with a checkpoint every K steps. series, x0: as filter(); w: (address, lane\n"
             "stride); grads: 6 tuples (address or 0, full in time, full in lanes): contiguous\n"
             "[T or 1, N or 1] arrays, summed over the other dimensions; grad_x0: 3 addresses\n"
             "of [N] arrays (or 0). Returns flags: 1 a gradient is not finite.");

static PyObject *ks_loglik_grad(PyObject *self, PyObject *args) {
    (void)self;
    int is_double, threads;
    Py_ssize_t T, N, K, w_sn;
    unsigned long long w;
    PyObject *series, *x0, *grads, *gx0;
    if (!PyArg_ParseTuple(args, "pnniOO(Kn)OOn", &is_double, &T, &N, &threads, &series, &x0, &w,
                          &w_sn, &grads, &gx0, &K))
        return NULL;
    ks_adj_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    if (!parse_job(&ctx.aj.fwd, T, N, series, x0)) return NULL;
    if (!PyTuple_Check(grads) || PyTuple_GET_SIZE(grads) != KS_NSERIES) {
        PyErr_SetString(PyExc_TypeError, "grads: expected 6 tuples (address, full_t, full_n)");
        return NULL;
    }
    for (int k = 0; k < KS_NSERIES; k++) {
        unsigned long long p;
        ks_grad *g = &ctx.aj.grad[k];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(grads, k), "Kpp", &p, &g->full_t, &g->full_n))
            return NULL;
        g->ptr = (char *)(uintptr_t)p;
    }
    if (!parse_addresses(gx0, 3, ctx.aj.gx0, "grad_x0")) return NULL;
    if (K < 1) K = 1;
    ctx.aj.K = K;
    ctx.aj.w = (const char *)(uintptr_t)w;
    ctx.aj.w_sn = w_sn;
    ctx.is_double = is_double;
    if (threads < 1) threads = 1;
    if (threads > KS_MAX_THREADS) threads = KS_MAX_THREADS;
    ctx.width = ks_chunk_width(N, threads, KS_ADJ_TILE, 4);
    const Py_ssize_t nchunks = (N + ctx.width - 1) / ctx.width;
    const int slots = threads < nchunks ? threads : (int)nchunks;
    int time_sums = 0; /* any [T, 1] gradient: per-thread [T] sums */
    for (int k = 0; k < KS_NSERIES; k++)
        time_sums |= ctx.aj.grad[k].ptr != NULL && ctx.aj.grad[k].full_t && !ctx.aj.grad[k].full_n;
    ctx.aj.tsum = (double *)calloc(time_sums ? (size_t)slots * KS_NSERIES * T : 1, sizeof(double));
    ctx.aj.ssum = (double *)calloc((size_t)slots * KS_NSERIES, sizeof(double));
    if (ctx.aj.tsum == NULL || ctx.aj.ssum == NULL) {
        free(ctx.aj.tsum);
        free(ctx.aj.ssum);
        return PyErr_NoMemory();
    }
    ks_task task = {ks_adj_chunk, &ctx, nchunks, 0, 0};
    int flags;
    Py_BEGIN_ALLOW_THREADS flags = ks_parallel(&task, slots);
    /* the per-thread sums of the gradients of lane-broadcast inputs */
    for (int k = 0; k < KS_NSERIES; k++) {
        const ks_grad *g = &ctx.aj.grad[k];
        if (g->ptr == NULL || g->full_n) continue;
        const Py_ssize_t len = g->full_t ? T : 1;
        for (Py_ssize_t t = 0; t < len; t++) {
            double s = 0.0;
            for (int th = 0; th < slots; th++)
                s += g->full_t ? ctx.aj.tsum[((Py_ssize_t)th * KS_NSERIES + k) * T + t]
                               : ctx.aj.ssum[th * KS_NSERIES + k];
            flags |= s - s == 0.0 ? 0 : KS_NOT_FINITE;
            if (is_double)
                ((double *)g->ptr)[t] = s;
            else
                ((float *)g->ptr)[t] = (float)s;
        }
    }
    Py_END_ALLOW_THREADS free(ctx.aj.tsum);
    free(ctx.aj.ssum);
    if (flags & KS_NO_MEMORY) return PyErr_NoMemory();
    return PyLong_FromLong(flags);
}

PyDoc_STRVAR(release_doc,
             "release(address, nbytes) -> bool\n\n"
             "Let the kernel reclaim the whole pages of a kept output block lazily\n"
             "(madvise MADV_FREE): until it does, writing them again costs no page fault.\n"
             "False where the system has no MADV_FREE (the block then stays resident).");

static PyObject *ks_release(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long addr;
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "Kn", &addr, &nbytes)) return NULL;
#if defined(MADV_FREE) && !defined(_WIN32)
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)addr + page - 1) / page * page;
    const uintptr_t hi = ((uintptr_t)addr + (uintptr_t)nbytes) / page * page;
    if (hi > lo && madvise((void *)lo, hi - lo, MADV_FREE) == 0) Py_RETURN_TRUE;
#else
    (void)addr;
    (void)nbytes;
#endif
    Py_RETURN_FALSE;
}

static PyMethodDef ks_methods[] = {
    {"filter", ks_filter, METH_VARARGS, filter_doc},
    {"release", ks_release, METH_VARARGS, release_doc},
    {"loglik_grad", ks_loglik_grad, METH_VARARGS, adjoint_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ks_module = {
    PyModuleDef_HEAD_INIT, "_native",
    "Fused CPU kernels of the scalar filter, smoother and log-likelihood adjoint "
    "(see kalmanscan/core/native.py).",
    -1, ks_methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&ks_module); }
