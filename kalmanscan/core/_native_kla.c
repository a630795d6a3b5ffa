/* The KLA op's forward on the CPU (kalmanscan/core/kla_op.py, backend "native"): one pass over
 * time, the lanes (m, s) of each token updated in place, the readout reduced over s.
 *
 * Per token t and lane (b, m, s), with qf = [a*a == 0], d = qf ? p : a*a, a1 = a * (1 - qf):
 *
 *     den = p lam + d,   lam' = (lam + qf) / den + Lv[m] k[s]^2,
 *     eta' = (a1 / den) eta + (v[m] Lv[m]) k[s],
 *     y[m] = sum_s q[s] eta' / lam',   yvar[m] = sum_s q[s]^2 / lam'
 *
 * the operations, in the order of kla_filter_sequential (same rounding per lane; the sum over s
 * runs s = 0, 1, ..., where torch's may group its terms otherwise). The kernel
 * (_native_kla_kernel.h) keeps the state slot-major so that its loops vectorize over channels. Inputs and outputs are contiguous row-major:
 * v, Lv, y, yvar [B, L, M]; k, q [B, L, S]; decay, process_var [M, S]; the state lam, eta
 * [B, M, S] (holding lam0, eta0 on entry, the final state on return); precisions [B, L, M, S]
 * (optional). Channels are split over threads (GIL released); each thread's rows are disjoint.
 * Forward only: gradients take the sequential or torch backends.
 */
#define KS_NO_FMA /* each lane rounds as the torch reference does (separate operations) */
#include "_native_common.h"

typedef struct {
    Py_ssize_t B, L, M, S;
    const char *v, *Lv, *k, *q, *decay, *process_var;
    char *y, *yvar, *lam, *eta, *prec; /* prec may be NULL */
    char *scratch; /* slot-major [S, M] arrays of the dtype: the coefficients p, qf, d, a1 and
                      the state lam, eta of every batch row ([B, S, M] each) */
} kla_job;

#define KLA_CAT_(a, b) a##b
#define KLA_CAT(a, b) KLA_CAT_(a, b)

#define KLA_FT double
#define KLA_NAME kla_f64
#include "_native_kla_kernel.h"
#undef KLA_FT
#undef KLA_NAME
#define KLA_FT float
#define KLA_NAME kla_f32
#include "_native_kla_kernel.h"
#undef KLA_FT
#undef KLA_NAME

typedef struct {
    const kla_job *job;
    int is_double;
    Py_ssize_t m0, m1;
} kla_part;

static void *kla_run_part(void *arg) {
    const kla_part *part = (const kla_part *)arg;
    if (part->is_double)
        kla_f64(part->job, part->m0, part->m1);
    else
        kla_f32(part->job, part->m0, part->m1);
    return NULL;
}

/* Run the job on `threads` threads (the caller included), channels split evenly in multiples of
 * 16 (whole cache lines of the output rows). A thread that cannot start leaves its channels to
 * the caller. */
static void kla_run(const kla_job *job, int is_double, int threads) {
    kla_part parts[KS_MAX_THREADS];
    const Py_ssize_t blocks = (job->M + 15) / 16;
    if (threads > blocks) threads = (int)blocks;
    if (threads < 1) threads = 1;
    for (int i = 0; i < threads; i++) {
        parts[i].job = job;
        parts[i].is_double = is_double;
        const Py_ssize_t b0 = blocks * i / threads, b1 = blocks * (i + 1) / threads;
        parts[i].m0 = b0 * 16;
        parts[i].m1 = b1 * 16 < job->M ? b1 * 16 : job->M;
    }
#ifdef KS_HAVE_PTHREADS
    pthread_t tids[KS_MAX_THREADS];
    int started[KS_MAX_THREADS] = {0};
    for (int i = 1; i < threads; i++)
        started[i] = pthread_create(&tids[i], NULL, kla_run_part, &parts[i]) == 0;
    kla_run_part(&parts[0]);
    for (int i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else
            kla_run_part(&parts[i]);
    }
#else
    for (int i = 0; i < threads; i++) kla_run_part(&parts[i]);
#endif
}

PyDoc_STRVAR(forward_doc,
             "forward(is_double, B, L, M, S, threads, inputs, outputs) -> None\n\n"
             "The KLA op's forward on contiguous arrays (addresses; see native.py).\n"
             "inputs: 6 addresses v, Lv [B, L, M], k, q [B, L, S], decay, process_var [M, S];\n"
             "outputs: 5 addresses y, yvar [B, L, M], lam, eta [B, M, S] (holding the initial\n"
             "state on entry, the final state on return) and precisions [B, L, M, S] or 0.");

static int kla_addresses(PyObject *tup, Py_ssize_t n, char **out, const char *name) {
    if (!PyTuple_Check(tup) || PyTuple_GET_SIZE(tup) != n) {
        PyErr_Format(PyExc_TypeError, "%s: expected a tuple of %zd addresses", name, n);
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned long long p = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(tup, i));
        if (PyErr_Occurred()) return 0;
        out[i] = (char *)(uintptr_t)p;
    }
    return 1;
}

static PyObject *kla_forward(PyObject *self, PyObject *args) {
    (void)self;
    int is_double, threads;
    Py_ssize_t B, L, M, S;
    PyObject *inputs, *outputs;
    if (!PyArg_ParseTuple(args, "pnnnniOO", &is_double, &B, &L, &M, &S, &threads, &inputs,
                          &outputs))
        return NULL;
    if (B < 1 || L < 1 || M < 1 || S < 1) {
        PyErr_Format(PyExc_ValueError, "B, L, M, S: expected positive sizes, got %zd, %zd, %zd, %zd",
                     B, L, M, S);
        return NULL;
    }
    char *in[6], *out[5];
    if (!kla_addresses(inputs, 6, in, "inputs") || !kla_addresses(outputs, 5, out, "outputs"))
        return NULL;
    for (int i = 0; i < 6; i++)
        if (in[i] == NULL) {
            PyErr_SetString(PyExc_ValueError, "inputs: expected 6 non-zero addresses");
            return NULL;
        }
    for (int i = 0; i < 4; i++)
        if (out[i] == NULL) {
            PyErr_SetString(PyExc_ValueError, "outputs: y, yvar, lam, eta need non-zero addresses");
            return NULL;
        }
    if (threads > KS_MAX_THREADS) threads = KS_MAX_THREADS;
    kla_job job = {B, L, M, S, in[0], in[1], in[2], in[3], in[4], in[5],
                   out[0], out[1], out[2], out[3], out[4], NULL};
    const size_t item = is_double ? sizeof(double) : sizeof(float);
    job.scratch = (char *)malloc((4 + 2 * (size_t)B) * (size_t)M * (size_t)S * item);
    if (job.scratch == NULL) return PyErr_NoMemory();
    if (is_double)
        kla_f64_coeffs(&job);
    else
        kla_f32_coeffs(&job);
    Py_BEGIN_ALLOW_THREADS kla_run(&job, is_double, threads);
    Py_END_ALLOW_THREADS free(job.scratch);
    Py_RETURN_NONE;
}

static PyMethodDef kla_methods[] = {
    {"forward", kla_forward, METH_VARARGS, forward_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kla_module = {
    PyModuleDef_HEAD_INIT, "_native_kla",
    "The KLA op's compiled CPU forward (see kalmanscan/core/native.py, kla_forward).", -1,
    kla_methods,
};

PyMODINIT_FUNC PyInit__native_kla(void) { return PyModule_Create(&kla_module); }
