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
 * again) and gives the smoothed covariance: at proper steps from the same information kept as
 * square-root rows (srif_*, below; (I + P J)^-1 P where they fail), at the diffuse steps in
 * square-root form G Lam^-1 G' (G = [L, D]), whenever that is well conditioned
 * (info_smoothed_cov). On a series with a diffuse start, a backward square-root
 * information filter (srif_*: Householder steps on [S | y]), its rows set at the first non-diffuse
 * step from r0 and N0 (srif_from_dk) and carried back over the diffuse steps, serves the
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
#define SKIP_TOL 1e-13    /* f below this times |h|^2 tr(P) with Dg = 0: an entry with no noise */
#define INFO_COND 1e4 /* |J| |Q| up to this along the carried J: the diffuse steps' info form */
#define SRIF_SWITCH 1e1 /* |P N P| up to this times |V|: r0, N0 set the square-root rows */
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

/* Padded vector forms for 4 < n <= KS_VMAX (the 13-state trend + seasonal model's products and
 * inverses): a matrix as n rows of NV = ceil(n / 4) four-double vectors (GCC vector extensions,
 * lowered per clone: AVX2 / AVX-512VL 256-bit, SSE2 pairs by default), zero past column n. The
 * scalar forms' row loops over 13 entries ran a vector body, a shorter vector epilogue and a scalar
 * tail with aliasing checks; these run whole vectors, with the accumulators in registers. Each
 * entry sees the same operations in the same order as in the scalar forms. */
#define KS_VMAX 16
/* set at import: AVX2 and FMA present (the v3 / v4 clones). Lowered to SSE2 pairs (the default
 * clone's target) the vector forms were 20% slower than the scalar ones: those serve there. */
static int ks_vec_ok = 0;
#define KS_VEC(n) ((n) > 4 && (n) <= KS_VMAX && ks_vec_ok)
typedef double v4d __attribute__((vector_size(32)));
typedef long long v4i __attribute__((vector_size(32)));
typedef double v4du __attribute__((vector_size(32), aligned(8))); /* unaligned access */
static const v4i ks_unit[4] = {{-1, 0, 0, 0}, {0, -1, 0, 0}, {0, 0, -1, 0}, {0, 0, 0, -1}};

static inline __attribute__((always_inline)) v4d v4_bcast(double x) { return (v4d){x, x, x, x}; }

/* A row of n entries into NV vectors (zero past entry n): whole vectors by unaligned loads, the
 * last partial one as the row's last four entries shifted down (no element stores that a vector
 * load would have to merge). n >= 4. */
static inline __attribute__((always_inline)) void v4_load_row(const int NV, int n, const double *a,
                                                                 v4d *row) {
    const int full = n >> 2;
    for (int v = 0; v < NV; v++) {
        if (v < full) {
            row[v] = *(const v4du *)(a + 4 * v);
        } else {
            const v4d y = *(const v4du *)(a + n - 4), z = {0.0, 0.0, 0.0, 0.0};
            switch (n & 3) {
            case 1: row[v] = __builtin_shuffle(y, z, (v4i){3, 4, 4, 4}); break;
            case 2: row[v] = __builtin_shuffle(y, z, (v4i){2, 3, 4, 4}); break;
            case 3: row[v] = __builtin_shuffle(y, z, (v4i){1, 2, 3, 4}); break;
            default: row[v] = z;
            }
        }
    }
}

/* The first n entries of the NV vectors row into a. */
static inline __attribute__((always_inline)) void v4_store_row(const int NV, int n, const v4d *row,
                                                                  double *a) {
    const int full = n >> 2;
    for (int v = 0; v < NV; v++) {
        if (v < full) {
            *(v4du *)(a + 4 * v) = row[v];
        } else {
            for (int r = 0; r < 4 && 4 * v + r < n; r++) a[4 * v + r] = row[v][r];
        }
    }
}

/* C = A B (n x n row-major), C's rows two at a time (accumulators in registers, the same
 * q order as mm). C may be A. */
static inline __attribute__((always_inline)) void mm_v(const int NV, int n, const double *A, const double *B, double *C) {
    v4d Bp[KS_VMAX * 4];
    for (int q = 0; q < n; q++) v4_load_row(NV, n, B + q * n, Bp + q * NV);
    int i = 0;
    for (; i + 2 <= n; i += 2) {
        v4d c0[4], c1[4];
        for (int v = 0; v < NV; v++) c0[v] = c1[v] = v4_bcast(0.0);
        const double *a0 = A + i * n, *a1 = a0 + n;
        for (int q = 0; q < n; q++) {
            const v4d x0 = v4_bcast(a0[q]), x1 = v4_bcast(a1[q]);
            for (int v = 0; v < NV; v++) {
                c0[v] += x0 * Bp[q * NV + v];
                c1[v] += x1 * Bp[q * NV + v];
            }
        }
        v4_store_row(NV, n, c0, C + i * n);
        v4_store_row(NV, n, c1, C + (i + 1) * n);
    }
    for (; i < n; i++) {
        v4d c0[4];
        for (int v = 0; v < NV; v++) c0[v] = v4_bcast(0.0);
        const double *a0 = A + i * n;
        for (int q = 0; q < n; q++) {
            const v4d x0 = v4_bcast(a0[q]);
            for (int v = 0; v < NV; v++) c0[v] += x0 * Bp[q * NV + v];
        }
        v4_store_row(NV, n, c0, C + i * n);
    }
}

/* spd_inverse's Gauss-Jordan elimination on the padded rows of M, in place: column k's
 * entries are replaced in registers (1 in the pivot row before its scaling, 0 in the others
 * before their update: the same ip and -f ip as the scalar form's stores), so no scalar store
 * meets a vector load of its row. 0 if a pivot is not positive. */
static inline __attribute__((always_inline)) int gj_inverse_v(const int NV, int n, v4d *M) {
    const v4i one = (v4i)v4_bcast(1.0);
    for (int k = 0; k < n; k++) {
        v4i msk[4];
        for (int v = 0; v < NV; v++) msk[v] = v == (k >> 2) ? ks_unit[k & 3] : (v4i){0, 0, 0, 0};
        v4d *rk = M + k * NV;
        const double piv = rk[k >> 2][k & 3];
        if (!(piv > 0.0)) return 0;
        const double ip = 1.0 / piv;
        const v4d ipv = v4_bcast(ip);
        for (int v = 0; v < NV; v++) rk[v] = (v4d)(((v4i)rk[v] & ~msk[v]) | (one & msk[v])) * ipv;
        for (int i = 0; i < n; i++) {
            if (i == k) continue;
            v4d *ri = M + i * NV;
            const v4d f = v4_bcast(ri[k >> 2][k & 3]);
            for (int v = 0; v < NV; v++) ri[v] = (v4d)((v4i)ri[v] & ~msk[v]) - f * rk[v];
        }
    }
    return 1;
}

/* With AVX-512 (checked at import: ks_has_512) the inverse runs on 8-double rows: half the vector
 * operations of the four-double form, the same arithmetic (masked moves for column k, fnmadd). The
 * functions carry their own target, so every clone of the kernel can call them. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && (__GNUC__ >= 11)
#include <immintrin.h>
#define KS_HAVE_512 1
#define KS_T512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
static int ks_has_512 = 0;

KS_T512 static inline __attribute__((always_inline)) int spd_inverse_512(const int NV, int n,
                                                                         const double *A,
                                                                         double *out) {
    __m512d M[KS_VMAX * 2];
    const __mmask8 tail = (__mmask8)((1u << (n - 8 * (NV - 1))) - 1);
    for (int i = 0; i < n; i++) {
        for (int v = 0; v < NV - 1; v++) M[i * NV + v] = _mm512_loadu_pd(A + i * n + 8 * v);
        M[i * NV + NV - 1] = _mm512_maskz_loadu_pd(tail, A + i * n + 8 * (NV - 1));
    }
    const __m512d one = _mm512_set1_pd(1.0), zero = _mm512_setzero_pd();
    for (int k = 0; k < n; k++) {
        const int vk = k >> 3;
        const __m512i lane = _mm512_set1_epi64(k & 7);
        __mmask8 mk[2];
        for (int v = 0; v < NV; v++) mk[v] = v == vk ? (__mmask8)(1u << (k & 7)) : (__mmask8)0;
        __m512d *rk = M + k * NV;
        const double piv = _mm512_cvtsd_f64(_mm512_permutexvar_pd(lane, rk[vk]));
        if (!(piv > 0.0)) return 0;
        const __m512d ipv = _mm512_set1_pd(1.0 / piv);
        __m512d rkv[2];
        for (int v = 0; v < NV; v++) {
            rkv[v] = _mm512_mul_pd(_mm512_mask_mov_pd(rk[v], mk[v], one), ipv);
            rk[v] = rkv[v];
        }
        for (int i = 0; i < n; i++) {
            if (i == k) continue;
            __m512d *ri = M + i * NV;
            const __m512d f = _mm512_permutexvar_pd(lane, ri[vk]);
            for (int v = 0; v < NV; v++)
                ri[v] = _mm512_fnmadd_pd(f, rkv[v], _mm512_mask_mov_pd(ri[v], mk[v], zero));
        }
    }
    double X[KS_VMAX * KS_VMAX];
    const int ld = 8 * NV;
    for (int i = 0; i < n; i++)
        for (int v = 0; v < NV; v++) _mm512_storeu_pd(X + i * ld + 8 * v, M[i * NV + v]);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++) {
            double s = 0.5 * (X[i * ld + j] + X[j * ld + i]);
            out[i * n + j] = s;
            out[j * n + i] = s;
        }
        out[i * n + i] = X[i * ld + i];
    }
    return 1;
}
KS_T512 __attribute__((noinline)) static int spd_inverse_512_1(int n, const double *A, double *out) {
    return spd_inverse_512(1, n, A, out);
}
KS_T512 __attribute__((noinline)) static int spd_inverse_512_2(int n, const double *A, double *out) {
    return spd_inverse_512(2, n, A, out);
}
#endif

static inline __attribute__((always_inline)) int spd_inverse_v(const int NV, int n, const double *A, double *out) {
    v4d M[KS_VMAX * 4];
    for (int i = 0; i < n; i++) v4_load_row(NV, n, A + i * n, M + i * NV);
    if (!gj_inverse_v(NV, n, M)) return 0;
    for (int i = 0; i < n; i++) {
        const v4d *ri = M + i * NV;
        for (int j = 0; j < i; j++) {
            double s = 0.5 * (ri[j >> 2][j & 3] + M[j * NV + (i >> 2)][i & 3]);
            out[i * n + j] = s;
            out[j * n + i] = s;
        }
        out[i * n + i] = ri[i >> 2][i & 3];
    }
    return 1;
}

#define KS_VEC_DISPATCH(n, call) \
    switch (((n) + 3) >> 2) {    \
    case 2: call(2); break;      \
    case 3: call(3); break;      \
    default: call(4); break;     \
    }

typedef struct {
    int n, d, zinf;
    int screen; /* a direction may be known exactly: the precision's screen runs (prec_inverse) */
    /* workspace */
    double *m, *P, *D, *tmp, *tmp2, *tmp2x, *u, *w, *Ms, *Minf, *Hy, *y, *Dg, *Lr, *G, *K0, *K1, *sig, *a;
    double *xp, *xd, *xw, *xc, *xx, *xu, *xl; /* observed_whole: P, D before the step; W; scratch */
    elem_t *el;
    int *obs_idx;
    /* sparse F of the current step: per row, nonzero columns and values */
    int *fnz, *fcol;
    double *fval;
    const double *fcur;
    /* predict_cov_v: 0.5 (Q + Q') of the step's Q (qcur) as padded rows */
    const double *qcur;
    v4d qs[KS_VMAX * 4];
} ws_t;

static inline const double *mat(const arr_t *a, Py_ssize_t b, Py_ssize_t t) {
    return a->p + b * a->sb + t * a->st;
}

static KS_INLINE void load_F(ws_t *w, const int n, const double *F) {
    if (F == w->fcur) return;
    w->fcur = F;
    for (int i = 0; i < n; i++) {
        int c = 0;
        for (int j = 0; j < n; j++) {
            double v = F[i * n + j];
            if (v != 0.0) {
                w->fcol[i * n + c] = j;
                w->fval[i * n + c] = v;
                c++;
            }
        }
        w->fnz[i] = c;
    }
}

/* out[i] = sum_j F[i][j] x[j] */
static KS_INLINE void F_mv(const ws_t *w, const int n, const double *x, double *out) {
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (int c = 0; c < w->fnz[i]; c++) s += w->fval[i * n + c] * x[w->fcol[i * n + c]];
        out[i] = s;
    }
}

/* out = F X (X is n x k, row stride n), out n x k row stride n */
static KS_INLINE void F_mm(const ws_t *w, const int n, const double *X, int k, double *out) {
    for (int i = 0; i < n; i++) {
        double *o = out + i * n;
        for (int j = 0; j < k; j++) o[j] = 0.0;
        for (int c = 0; c < w->fnz[i]; c++) {
            double f = w->fval[i * n + c];
            const double *x = X + w->fcol[i * n + c] * n;
            for (int j = 0; j < k; j++) o[j] += f * x[j];
        }
    }
}

/* 4 x 4 block transpose of the padded n-row matrix A into At (rows past n of A read as zero). */
static inline __attribute__((always_inline)) void v4_transpose(const int NV, int n, const v4d *A,
                                                                  v4d *At) {
    const v4d z = {0.0, 0.0, 0.0, 0.0};
    for (int bi = 0; bi < NV; bi++) {
        for (int bj = 0; bj < NV; bj++) {
            v4d r[4];
            for (int q = 0; q < 4; q++) r[q] = 4 * bi + q < n ? A[(4 * bi + q) * NV + bj] : z;
            const v4d t0 = __builtin_shuffle(r[0], r[1], (v4i){0, 4, 2, 6}),
                      t1 = __builtin_shuffle(r[0], r[1], (v4i){1, 5, 3, 7}),
                      t2 = __builtin_shuffle(r[2], r[3], (v4i){0, 4, 2, 6}),
                      t3 = __builtin_shuffle(r[2], r[3], (v4i){1, 5, 3, 7});
            const v4d c[4] = {__builtin_shuffle(t0, t2, (v4i){0, 1, 4, 5}),
                              __builtin_shuffle(t1, t3, (v4i){0, 1, 4, 5}),
                              __builtin_shuffle(t0, t2, (v4i){2, 3, 6, 7}),
                              __builtin_shuffle(t1, t3, (v4i){2, 3, 6, 7})};
            for (int q = 0; q < 4; q++)
                if (4 * bj + q < n) At[(4 * bj + q) * NV + bi] = c[q];
        }
    }
}

/* out = P h for the symmetric P (P h = sum_j h_j P[j, :]: the scalar form's sums, same order). */
static inline __attribute__((always_inline)) void sym_mv_v(const int NV, int n, const double *P,
                                                              const double *h, double *out) {
    v4d acc[4], x[4];
    for (int v = 0; v < NV; v++) acc[v] = v4_bcast(0.0);
    for (int j = 0; j < n; j++) {
        const v4d hj = v4_bcast(h[j]);
        v4_load_row(NV, n, P + j * n, x);
        for (int v = 0; v < NV; v++) acc[v] += hj * x[v];
    }
    v4_store_row(NV, n, acc, out);
}

static KS_INLINE void sym_mv(int n, const double *P, const double *h, double *out) {
    if (KS_VEC(n)) {
#define KS_MV_V(NV) sym_mv_v(NV, n, P, h, out)
        KS_VEC_DISPATCH(n, KS_MV_V)
#undef KS_MV_V
        return;
    }
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (int j = 0; j < n; j++) s += P[i * n + j] * h[j];
        out[i] = s;
    }
}

/* N += -h x' - x h' + c h h' by padded rows (the scalar form's expression per entry). */
static inline __attribute__((always_inline)) void rank2_update_v(const int NV, int n, double *N,
                                                                    const double *h,
                                                                    const double *x, double c) {
    v4d hv[4], xv[4], row[4];
    v4_load_row(NV, n, h, hv);
    v4_load_row(NV, n, x, xv);
    for (int i = 0; i < n; i++) {
        const v4d hi = v4_bcast(h[i]), xi = v4_bcast(x[i]), chi = v4_bcast(c * h[i]);
        v4_load_row(NV, n, N + i * n, row);
        for (int v = 0; v < NV; v++) row[v] += -hi * xv[v] - xi * hv[v] + chi * hv[v];
        v4_store_row(NV, n, row, N + i * n);
    }
}

static KS_INLINE void rank2_update(int n, double *N, const double *h, const double *x, double c) {
    if (KS_VEC(n)) {
#define KS_R2_V(NV) rank2_update_v(NV, n, N, h, x, c)
        KS_VEC_DISPATCH(n, KS_R2_V)
#undef KS_R2_V
        return;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) N[i * n + j] += -h[i] * x[j] - x[i] * h[j] + c * h[i] * h[j];
}

/* dst = F src on padded rows (n rows of NV vectors): row i sums F's nonzero entries of row i
 * times the rows of src they select, in F's stored order. */
static inline __attribute__((always_inline)) void v4_f_rows(const int NV, const ws_t *w, int n,
                                                            const v4d *src, v4d *dst) {
    for (int i = 0; i < n; i++) {
        v4d acc[4];
        for (int v = 0; v < NV; v++) acc[v] = v4_bcast(0.0);
        for (int c = 0; c < w->fnz[i]; c++) {
            const v4d f = v4_bcast(w->fval[i * n + c]);
            const v4d *x = src + w->fcol[i * n + c] * NV;
            for (int v = 0; v < NV; v++) acc[v] += f * x[v];
        }
        for (int v = 0; v < NV; v++) dst[i * NV + v] = acc[v];
    }
}

/* dst = F' src on padded rows: row c of src scattered into the rows F's row c selects, scaled
 * by its entries (rows of F in order, then F's stored order). */
static inline __attribute__((always_inline)) void v4_ft_rows(const int NV, const ws_t *w, int n,
                                                             const v4d *src, v4d *dst) {
    for (int i = 0; i < n * NV; i++) dst[i] = v4_bcast(0.0);
    for (int c = 0; c < n; c++)
        for (int q = 0; q < w->fnz[c]; q++) {
            v4d *o = dst + w->fcol[c * n + q] * NV;
            const v4d f = v4_bcast(w->fval[c * n + q]);
            for (int v = 0; v < NV; v++) o[v] += f * src[c * NV + v];
        }
}

/* predict_cov on padded rows: T1 = F P, then F T1' (= F P F', P symmetric) by rows; entry (i, j),
 * j >= i, of the latter is the scalar form's (j, i) (the same sum in the same order), and both
 * triangles are taken from it. */
static inline __attribute__((always_inline)) void predict_cov_v(const int NV, ws_t *w, int n,
                                                                   double *P, const double *Q) {
    v4d Pp[KS_VMAX * 4], T1[KS_VMAX * 4], Tt[KS_VMAX * 4];
    if (Q != w->qcur) {
        for (int i = 0; i < n; i++) {
            double row[4 * 4];
            for (int j = 0; j < 4 * NV; j++) row[j] = j < n ? 0.5 * (Q[i * n + j] + Q[j * n + i]) : 0.0;
            memcpy(w->qs + i * NV, row, NV * sizeof(v4d));
        }
        w->qcur = Q;
    }
    for (int i = 0; i < n; i++) v4_load_row(NV, n, P + i * n, Pp + i * NV);
    v4_f_rows(NV, w, n, Pp, T1); /* T1 = F P */
    v4_transpose(NV, n, T1, Tt);
    v4_f_rows(NV, w, n, Tt, Pp); /* Pp = F T1' */
    v4_transpose(NV, n, Pp, T1); /* T1 = Pp' */
    const v4d iota = {0.0, 1.0, 2.0, 3.0};
    for (int i = 0; i < n; i++) { /* row i: (j >= i ? Pp[i][j] : Pp[j][i]) + Qs[i][j] */
        v4d row[4];
        const v4d di = v4_bcast((double)i);
        for (int v = 0; v < NV; v++) {
            const v4i up = iota + v4_bcast(4.0 * v) >= di;
            const v4d x = (v4d)(((v4i)Pp[i * NV + v] & up) | ((v4i)T1[i * NV + v] & ~up));
            row[v] = x + w->qs[i * NV + v];
        }
        v4_store_row(NV, n, row, P + i * n);
    }
}

/* P <- F P F' + Q (symmetric) */
static KS_INLINE void predict_cov(ws_t *w, const int n, double *P, const double *Q) {
    if (KS_VEC(n)) {
#define KS_PRED_V(NV) predict_cov_v(NV, w, n, P, Q)
        KS_VEC_DISPATCH(n, KS_PRED_V)
#undef KS_PRED_V
        return;
    }
    double *T1 = w->tmp;
    F_mm(w, n, P, n, T1); /* T1 = F P */
    for (int i = 0; i < n; i++) {
        for (int j = 0; j <= i; j++) { /* (F P F')[i][j] = sum_c F[j][c] T1[i][c] */
            double s = 0.0;
            for (int c = 0; c < w->fnz[j]; c++) s += w->fval[j * n + c] * T1[i * n + w->fcol[j * n + c]];
            P[i * n + j] = s;
        }
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double s = P[i * n + j] + 0.5 * (Q[i * n + j] + Q[j * n + i]);
            P[i * n + j] = s;
            P[j * n + i] = s;
        }
}

/* back_cov on padded rows: T1 = N F as its transpose, T1' = F' N' (N' row by row: F's entries
 * in the scalar form's order, so each entry sums the same terms in the same order), then N = F' T1
 * (rows of T1 scattered by F's entries) and 0.5 (N + N') (the scalar form's values; the diagonal
 * is 0.5 (x + x) = x). */
static inline __attribute__((always_inline)) void back_cov_v(const int NV, ws_t *w, int n,
                                                                double *N) {
    v4d A[KS_VMAX * 4], B[KS_VMAX * 4];
    for (int i = 0; i < n; i++) v4_load_row(NV, n, N + i * n, A + i * NV);
    v4_transpose(NV, n, A, B); /* B = N' */
    v4_ft_rows(NV, w, n, B, A); /* A = T1' = F' N' */
    v4_transpose(NV, n, A, B);  /* B = T1 */
    v4_ft_rows(NV, w, n, B, A); /* A = F' T1 */
    v4_transpose(NV, n, A, B); /* B = A' */
    const v4d half = v4_bcast(0.5);
    for (int i = 0; i < n; i++) {
        v4d row[4];
        for (int v = 0; v < NV; v++) row[v] = half * (A[i * NV + v] + B[i * NV + v]);
        v4_store_row(NV, n, row, N + i * n);
    }
}

/* N <- F' N F for symmetric N; r <- F' r */
static KS_INLINE void back_cov(ws_t *w, const int n, double *N) {
    if (KS_VEC(n)) {
#define KS_BACK_V(NV) back_cov_v(NV, w, n, N)
        KS_VEC_DISPATCH(n, KS_BACK_V)
#undef KS_BACK_V
        return;
    }
    double *T1 = w->tmp;
    /* T1 = N F: T1[i][j] = sum_c N[i][c] F[c][j]; scatter rows of F */
    for (int i = 0; i < n * n; i++) T1[i] = 0.0;
    for (int c = 0; c < n; c++)
        for (int q = 0; q < w->fnz[c]; q++) {
            int j = w->fcol[c * n + q];
            double f = w->fval[c * n + q];
            for (int i = 0; i < n; i++) T1[i * n + j] += N[i * n + c] * f;
        }
    /* N = F' T1: N[i][j] = sum_c F[c][i] T1[c][j] */
    for (int i = 0; i < n * n; i++) N[i] = 0.0;
    for (int c = 0; c < n; c++)
        for (int q = 0; q < w->fnz[c]; q++) {
            int i = w->fcol[c * n + q];
            double f = w->fval[c * n + q];
            for (int j = 0; j < n; j++) N[i * n + j] += f * T1[c * n + j];
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            double s = 0.5 * (N[i * n + j] + N[j * n + i]);
            N[i * n + j] = s;
            N[j * n + i] = s;
        }
}

static KS_INLINE void back_vec(ws_t *w, const int n, double *r) {
    double *o = w->w;
    for (int i = 0; i < n; i++) o[i] = 0.0;
    for (int c = 0; c < n; c++)
        for (int q = 0; q < w->fnz[c]; q++) o[w->fcol[c * n + q]] += w->fval[c * n + q] * r[c];
    memcpy(r, o, n * sizeof(double));
}

/* C = A B for n x n row-major matrices, four rows at a time (independent accumulation chains,
 * contiguous vectorizable row updates). */
static KS_INLINE void mm(int n, const double *restrict A, const double *restrict B,
                            double *restrict C) {
    if (KS_VEC(n)) {
#define KS_MM_V(NV) mm_v(NV, n, A, B, C)
        KS_VEC_DISPATCH(n, KS_MM_V)
#undef KS_MM_V
        return;
    }
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        double *c0 = C + i * n, *c1 = c0 + n, *c2 = c1 + n, *c3 = c2 + n;
        for (int j = 0; j < 4 * n; j++) c0[j] = 0.0;
        for (int q = 0; q < n; q++) {
            const double *b = B + q * n;
            double a0 = A[i * n + q], a1 = A[(i + 1) * n + q], a2 = A[(i + 2) * n + q],
                   a3 = A[(i + 3) * n + q];
            for (int j = 0; j < n; j++) {
                double bj = b[j];
                c0[j] += a0 * bj;
                c1[j] += a1 * bj;
                c2[j] += a2 * bj;
                c3[j] += a3 * bj;
            }
        }
    }
    for (; i < n; i++) {
        double *c0 = C + i * n;
        for (int j = 0; j < n; j++) c0[j] = 0.0;
        for (int q = 0; q < n; q++) {
            const double *b = B + q * n;
            double a0 = A[i * n + q];
            for (int j = 0; j < n; j++) c0[j] += a0 * b[j];
        }
    }
}

/* B <- A^-1 B (n x n each, row-major) by Gaussian elimination with partial pivoting; A is
 * destroyed. 0 if A is singular. */
static KS_INLINE int solve(int n, double *A, double *B) {
    for (int k = 0; k < n; k++) {
        int p = k;
        for (int i = k + 1; i < n; i++)
            if (fabs(A[i * n + k]) > fabs(A[p * n + k])) p = i;
        if (!(A[p * n + k] != 0.0)) return 0;
        if (p != k)
            for (int j = 0; j < n; j++) {
                double t = A[k * n + j];
                A[k * n + j] = A[p * n + j];
                A[p * n + j] = t;
                t = B[k * n + j];
                B[k * n + j] = B[p * n + j];
                B[p * n + j] = t;
            }
        double ip = 1.0 / A[k * n + k];
        for (int i = k + 1; i < n; i++) {
            double f = A[i * n + k] * ip;
            if (f == 0.0) continue;
            for (int j = k; j < n; j++) A[i * n + j] -= f * A[k * n + j];
            for (int j = 0; j < n; j++) B[i * n + j] -= f * B[k * n + j];
        }
    }
    for (int k = n - 1; k >= 0; k--) {
        double ip = 1.0 / A[k * n + k];
        for (int j = 0; j < n; j++) B[k * n + j] *= ip;
        for (int i = 0; i < k; i++) {
            double f = A[i * n + k];
            if (f == 0.0) continue;
            for (int j = 0; j < n; j++) B[i * n + j] -= f * B[k * n + j];
        }
    }
    return 1;
}

/* |A|_inf |B|_inf: a bound on the amplification of (I + A B)^-1 */
static KS_INLINE double norm_prod(int n, const double *A, const double *B) {
    double na = 0.0, nb = 0.0;
    for (int i = 0; i < n; i++) {
        double sa = 0.0, sb = 0.0;
        for (int j = 0; j < n; j++) {
            sa += fabs(A[i * n + j]);
            sb += fabs(B[i * n + j]);
        }
        if (sa > na) na = sa;
        if (sb > nb) nb = sb;
    }
    return na * nb;
}

/* J <- F' (I + J Q)^-1 J F: information on the previous state (F of the current step loaded). */
static KS_INLINE int info_back(ws_t *w, const int n, double *J, const double *Q, double *A) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = i == j ? 1.0 : 0.0;
            for (int q = 0; q < n; q++) s += J[i * n + q] * Q[q * n + j];
            A[i * n + j] = s;
        }
    if (!solve(n, A, J)) return 0;
    back_cov(w, n, J);
    return 1;
}

/* Inverse of the symmetric positive-definite A (n x n) into out by Gauss-Jordan elimination
 * without pivoting (the pivots are the Schur complements' diagonals, positive for a positive-
 * definite A); 0 if a pivot is not positive. Every inner loop runs over a whole contiguous row,
 * which vectorizes; L is unused scratch kept for the signature. */
static KS_INLINE int spd_inverse(int n, const double *A, double *L, double *out) {
    (void)L;
    if (KS_VEC(n)) {
#ifdef KS_HAVE_512
        if (ks_has_512) return n > 8 ? spd_inverse_512_2(n, A, out) : spd_inverse_512_1(n, A, out);
#endif
        int ok = 0;
#define KS_INV_V(NV) ok = spd_inverse_v(NV, n, A, out)
        KS_VEC_DISPATCH(n, KS_INV_V)
#undef KS_INV_V
        return ok;
    }
    memcpy(out, A, (size_t)n * n * sizeof(double));
    for (int k = 0; k < n; k++) {
        double *rk = out + k * n;
        double piv = rk[k];
        if (!(piv > 0.0)) return 0;
        double ip = 1.0 / piv;
        for (int j = 0; j < n; j++) rk[j] *= ip;
        /* column k is written after the vector updates (a scalar store just before a vector load
           of the same row stalls store forwarding) */
        for (int i = 0; i < n; i++) {
            if (i == k) continue;
            double *ri = out + i * n;
            double f = ri[k];
            for (int j = 0; j < n; j++) ri[j] -= f * rk[j];
            ri[k] = -f * ip;
        }
        rk[k] = ip;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            double s = 0.5 * (out[i * n + j] + out[j * n + i]);
            out[i * n + j] = s;
            out[j * n + i] = s;
        }
    return 1;
}

/* Whether max diag(A) max diag(A^-1) >= 1 / (64 eps n^2): the screen of
 * kalmanscan/dense/singular.py, met by every A with a direction known exactly (cond(A) >= 1 / (64
 * eps) implies it). inv the inverse spd_inverse gave; O(n). Not inlined: the kernel's hot loop
 * keeps its code (and its compiled schedule) where the screen is off. */
static KS_NOINLINE int near_singular(int n, const double *A, const double *inv) {
    double a = 0.0, b = 0.0;
    for (int i = 0; i < n; i++) {
        const double x = A[i * n + i], y = inv[i * n + i];
        a = x > a ? x : a;
        b = y > b ? y : b;
    }
    return !(a * b * (64.0 * 2.220446049250313e-16 * (double)(n * n)) < 1.0);
}

/* A reported precision: spd_inverse, and 0 (the row is NaN, for the rule applied in Python)
 * where that fails or, while w->screen is on (a direction may be known exactly), where
 * near_singular flags A. Off, the screen costs one predicted branch. */
static KS_INLINE int prec_inverse(const ws_t *w, int n, const double *A, double *L, double *out) {
    if (!spd_inverse(n, A, L, out)) return 0;
    return !w->screen || !near_singular(n, A, out);
}

/* Squared singular values of G (m x k, row stride ld) into sig[0..k), largest first, by one-sided
 * Jacobi on its columns (G is overwritten). */
static KS_INLINE void sq_singular_values(double *G, int m, int k, int ld, double *sig) {
    for (int sweep = 0; sweep < 30; sweep++) {
        double off = 0.0;
        for (int p = 0; p < k; p++)
            for (int q = p + 1; q < k; q++) {
                double a = 0.0, b = 0.0, g = 0.0;
                for (int i = 0; i < m; i++) {
                    double x = G[i * ld + p], y = G[i * ld + q];
                    a += x * x;
                    b += y * y;
                    g += x * y;
                }
                if (g == 0.0 || fabs(g) <= 1e-15 * sqrt(a * b)) continue;
                off = 1.0;
                double zeta = (b - a) / (2.0 * g);
                double t = copysign(1.0, zeta) / (fabs(zeta) + sqrt(1.0 + zeta * zeta));
                double cs = 1.0 / sqrt(1.0 + t * t), sn = cs * t;
                for (int i = 0; i < m; i++) {
                    double x = G[i * ld + p], y = G[i * ld + q];
                    G[i * ld + p] = cs * x - sn * y;
                    G[i * ld + q] = sn * x + cs * y;
                }
            }
        if (off == 0.0) break;
    }
    for (int p = 0; p < k; p++) {
        double s = 0.0;
        for (int i = 0; i < m; i++) s += G[i * ld + p] * G[i * ld + p];
        int q = p; /* insertion, descending */
        while (q > 0 && sig[q - 1] < s) {
            sig[q] = sig[q - 1];
            q--;
        }
        sig[q] = s;
    }
}

/* The step's pdet term 1/2 log pdet(2 pi G G') with the rank r of G = H_o D taken as the number
 * of entries the update found diffuse (rank(H_o D) in exact arithmetic): the r largest singular
 * values. A threshold on the singular values themselves would count a rounding residue of D
 * (|D' h| ~ eps, an entry the update treats as proper) as a diffuse direction. */
static KS_INLINE double pdet_term(const double *sig, int r) {
    double lp = 0.0;
    for (int p = 0; p < r; p++) lp += log(sig[p]);
    return 0.5 * lp + 0.5 * r * LOG_2PI;
}

/* Gather the observed entries of step (b, t) and decorrelate them: Hy = L^-1 H_o, y = L^-1 z_o
 * with R_o = L Dg L'. Returns the number of observed entries. With k > 0 and want_sig also
 * leaves in w->sig the squared singular values of G = H_o D (for the step's pdet term). */
static KS_INLINE int gather(ws_t *w, const int n, const arr_t *in, Py_ssize_t b, Py_ssize_t t, int k, int want_sig) {
    int d = w->d, o = 0;
    const arr_t *Z = &in[I_Z];
    const double *H = mat(&in[I_H], b, t), *R = mat(&in[I_R], b, t);
    for (int i = 0; i < d; i++) {
        double zi = Z->p[b * Z->sb + t * Z->st + i * Z->se];
        if (zi != zi) continue; /* NaN: missing */
        if (isinf(zi)) w->zinf = 1;
        w->obs_idx[o] = i;
        w->y[o] = zi;
        memcpy(w->Hy + o * n, H + i * n, n * sizeof(double));
        o++;
    }
    if (o == 0) return 0;
    if (k > 0 && want_sig) { /* G = H_o D */
        for (int p = 0; p < o; p++)
            for (int j = 0; j < k; j++) {
                double s = 0.0;
                for (int q = 0; q < n; q++) s += w->Hy[p * n + q] * w->D[q * n + j];
                w->G[p * n + j] = s;
            }
        sq_singular_values(w->G, o, k, n, w->sig);
    }
    /* LDL' of R_o (PSD; a zero pivot zeroes its column): a pivot at rounding level of its own
       diagonal entry, as in semidef_chol (not of R's largest: R = diag(1e16, 1) is two noisy
       entries) */
    for (int j = 0; j < o; j++) {
        int ij = w->obs_idx[j];
        double s = R[ij * d + ij];
        for (int q = 0; q < j; q++) s -= w->Lr[j * o + q] * w->Lr[j * o + q] * w->Dg[q];
        if (s <= 1e-15 * fabs(R[ij * d + ij])) { /* an exact entry: it may know a direction */
            s = 0.0;
            w->screen = 1;
        }
        w->Dg[j] = s;
        w->Lr[j * o + j] = 1.0;
        for (int i = j + 1; i < o; i++) {
            int ii = w->obs_idx[i];
            double v = R[ii * d + ij];
            for (int q = 0; q < j; q++) v -= w->Lr[i * o + q] * w->Lr[j * o + q] * w->Dg[q];
            w->Lr[i * o + j] = s > 0.0 ? v / s : 0.0;
        }
    }
    for (int i = 1; i < o; i++) /* forward substitution with the unit lower L */
        for (int q = 0; q < i; q++) {
            double l = w->Lr[i * o + q];
            if (l == 0.0) continue;
            w->y[i] -= l * w->y[q];
            for (int j = 0; j < n; j++) w->Hy[i * n + j] -= l * w->Hy[q * n + j];
        }
    return o;
}

/* D <- D (I - 2 ww'/w'w), the Householder reflection that maps u = D' h (in w->u) to alpha e0;
 * then column 0 (the one h sees) is dropped. */
static KS_INLINE void house_drop(ws_t *w, const int n, int k) {
    double *D = w->D, *u = w->u;
    double nu = 0.0;
    for (int j = 0; j < k; j++) nu += u[j] * u[j];
    double alpha = -copysign(sqrt(nu), u[0]);
    for (int j = 0; j < k; j++) w->w[j] = u[j];
    w->w[0] -= alpha;
    double wn2 = 0.0;
    for (int j = 0; j < k; j++) wn2 += w->w[j] * w->w[j];
    for (int i = 0; i < n; i++) {
        double *Di = D + i * n;
        double s = 0.0;
        for (int j = 0; j < k; j++) s += Di[j] * w->w[j];
        s *= 2.0 / wn2;
        for (int j = 1; j < k; j++) Di[j - 1] = Di[j] - s * w->w[j];
        Di[k - 1] = 0.0;
    }
}

static KS_INLINE int observed_whole(ws_t *w, const int n, int o, int kb, const double *Pp,
                                    const double *Dp, double *P);

/* After house_drop resolved the direction Minf = D u (u = D' h, nu2 = |u|^2): its remaining k
 * columns are orthogonal to h in exact arithmetic. The reflection leaves each a residue of
 * eps |Minf| / |u| along the dropped column (1 - 2 w_j^2 / w'w cancels); next to a diffuse
 * column the dynamics shrank to 1e-6 of it (a contracting state not yet observed) that residue
 * is above DIFFUSE_TOL and made a later entry that does not see the column "diffuse" (random
 * diagonal models, seeds 29 and 341 of test_small_diffuse_directions_stay_diffuse_against_oracle's
 * family: 2.5 and 3.3 sd off). It is removed as the reference removes the resolved direction,
 * c <- c - Minf (h'c) / |u|^2, which is exact in exact arithmetic (h'c = 0 there). */
static KS_INLINE void drop_residue(ws_t *w, const int n, int k, const double *h, double nu2) {
    double *D = w->D;
    const double *Minf = w->Minf;
    for (int j = 0; j < k; j++) {
        double s = 0.0;
        for (int i = 0; i < n; i++) s += h[i] * D[i * n + j];
        s /= nu2;
        for (int i = 0; i < n; i++) D[i * n + j] -= s * Minf[i];
    }
}

/* The diffuse factor after the prediction, X = F D (w->tmp; D_prev in w->D, k columns); returns
 * the new k, the factor then in w->tmp's first k columns (w->D's others zeroed). X itself unless
 * its columns need more (sequential.factor_basis is the same rule): a column at the rounding
 * level of its own product (every entry at most DIFFUSE_TOL times |F| |D_prev|, its entrywise
 * rounding bound: what a singular F forgets, while a diagonal F keeps any nonzero entry), fewer
 * than k independent columns (normalized, largest first, each within DIFFUSE_TOL of the earlier
 * ones' span is theirs), or the independent ones more than 1 / FACTOR_GRADE apart in size or
 * outside FACTOR_SPAN^-1 .. FACTOR_SPAN. Then an orthonormal basis of their span (modified
 * Gram-Schmidt, twice), and k its size: the same diffuse directions (only range(D) enters the
 * limit), where F = diag(1e-100, 0.9) made one 1e-200 the other's size, which the entries' test
 * (relative to |D|_F) took as resolved and whose squares underflow. Ordinary factors pass through
 * untouched (run_series keeps its former copy of w->tmp into w->D: the same bits). */
static KS_NOINLINE int factor_basis(ws_t *w, const int n, int k) {
    const double *X = w->tmp;
    double *D = w->D, *Y = w->xc, *Qb = w->xx, *nrm = w->Ms, *left = w->Minf, *y = w->u;
    int trig = 0;
    for (int j = 0; j < k; j++) {
        int live = 0, real = 0;
        double top = 0.0;
        for (int i = 0; i < n; i++) {
            double bnd = 0.0;
            for (int c = 0; c < w->fnz[i]; c++)
                bnd += fabs(w->fval[i * n + c]) * fabs(D[w->fcol[i * n + c] * n + j]);
            double x = fabs(X[i * n + j]);
            live |= bnd > 0.0;
            real |= x > DIFFUSE_TOL * bnd;
            if (x > top) top = x;
        }
        if (live && !real) trig = 1;
        left[j] = real;
        nrm[j] = 0.0;
        if (!real) continue;
        double s = 0.0; /* the norm without squares of tiny entries */
        for (int i = 0; i < n; i++) {
            double v = X[i * n + j] / top;
            Y[i * n + j] = v;
            s += v * v;
        }
        s = sqrt(s);
        for (int i = 0; i < n; i++) Y[i * n + j] /= s;
        nrm[j] = top * s;
    }
    int picked = 0;
    double lo = INFINITY, hi = 0.0;
    for (int p = 0; p < k; p++) {
        int j = -1;
        for (int q = 0; q < k; q++)
            if (left[q] != 0.0 && (j < 0 || nrm[q] > nrm[j])) j = q;
        if (j < 0) break;
        left[j] = 0.0;
        for (int i = 0; i < n; i++) y[i] = Y[i * n + j];
        for (int pass = 0; pass < 2; pass++)
            for (int q = 0; q < picked; q++) {
                double r = 0.0;
                for (int i = 0; i < n; i++) r += Qb[i * n + q] * y[i];
                for (int i = 0; i < n; i++) y[i] -= r * Qb[i * n + q];
            }
        double res = 0.0;
        for (int i = 0; i < n; i++) res += y[i] * y[i];
        res = sqrt(res);
        if (!(res > DIFFUSE_TOL)) continue;
        for (int i = 0; i < n; i++) Qb[i * n + picked] = y[i] / res;
        picked++;
        if (nrm[j] < lo) lo = nrm[j];
        if (nrm[j] > hi) hi = nrm[j];
    }
    if (picked < k ||
        (picked > 0 && (lo < FACTOR_GRADE * hi || hi > FACTOR_SPAN || lo < 1.0 / FACTOR_SPAN)))
        trig = 1;
    if (!trig) return k;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) {
            w->tmp[i * n + j] = j < picked ? Qb[i * n + j] : 0.0;
            D[i * n + j] = 0.0;
        }
    return picked;
}

/* Scalar updates of the o gathered entries on (a, P, D[:, :k]); returns the new k. Adds the
 * entries' log-likelihood to *ll; records each entry in w->el (and its gains in K0/K1 rows when
 * keep != 0: K0 row p = gain of a proper entry or M_inf/f_inf, K1 row p = the diffuse K1). */
static KS_INLINE int update(ws_t *w, const int n, int o, double *a, double *P, int k, double *ll, int keep,
                            int fin, int whole) {
    double *D = w->D, *u = w->u, *Ms = w->Ms, *Minf = w->Minf;
    const int k_in = k; /* whole: w->xp, w->xd hold the prediction's P and D (observed_whole) */
    for (int p = 0; p < o; p++) {
        const double *h = w->Hy + p * n;
        double v = w->y[p], hh = 0.0;
        for (int j = 0; j < n; j++) {
            v -= h[j] * a[j];
            hh += h[j] * h[j];
        }
        elem_t *e = &w->el[p];
        e->type = 0;
        e->v = v;
        sym_mv(n, P, h, Ms); /* P is symmetric (mirrored wherever it is written) */
        double fs = w->Dg[p];
        for (int i = 0; i < n; i++) fs += h[i] * Ms[i];
        e->fs = fs;
        int diffuse = 0;
        double nu = 0.0;
        if (k > 0) {
            double dn = 0.0;
            for (int j = 0; j < k; j++) {
                double s = 0.0;
                for (int i = 0; i < n; i++) {
                    s += D[i * n + j] * h[i];
                    dn += D[i * n + j] * D[i * n + j];
                }
                u[j] = s;
                nu += s * s;
            }
            nu = sqrt(nu);
            diffuse = nu > DIFFUSE_TOL * sqrt(hh * dn);
        }
        if (diffuse) /* the column of the factor that h sees, times nu: M_inf = D u */
            for (int i = 0; i < n; i++) {
                double s = 0.0;
                for (int j = 0; j < k; j++) s += D[i * n + j] * u[j];
                Minf[i] = s;
            }
        if (diffuse && fin) { /* finite factor: P = P_s + D D' updated exactly (no D-scale term) */
            double f = fs + nu * nu, nu2 = nu * nu;
            for (int i = 0; i < n; i++) a[i] += (Ms[i] + Minf[i]) * v / f;
            /* P_s + d d' - (M_s + nu d)(M_s + nu d)' / f, d = D u / nu the column h sees:
               P_s - M_s M_s' / f - (M_s Minf' + Minf M_s') / f + (fs / f) Minf Minf' / nu^2 */
            double c1 = 1.0 / f, c2 = fs / (f * nu2);
            for (int i = 0; i < n; i++)
                for (int j = 0; j <= i; j++) {
                    double s = P[i * n + j] - (Ms[i] * Ms[j] + Ms[i] * Minf[j] + Minf[i] * Ms[j]) * c1 +
                               Minf[i] * Minf[j] * c2;
                    P[i * n + j] = s;
                    P[j * n + i] = s;
                }
            *ll -= 0.5 * (LOG_2PI + log(f) + v * v / f);
            house_drop(w, n, k);
            k--;
            drop_residue(w, n, k, h, nu2);
            e->type = 1;
            e->f = f;
            if (keep)
                for (int i = 0; i < n; i++) w->K0[p * n + i] = (Ms[i] + Minf[i]) / f;
            continue;
        }
        if (diffuse) {
            double finf = nu * nu;
            for (int i = 0; i < n; i++) a[i] += Minf[i] * v / finf;
            double c2 = fs / (finf * finf);
            for (int i = 0; i < n; i++)
                for (int j = 0; j <= i; j++) {
                    double s = P[i * n + j] + Minf[i] * Minf[j] * c2 -
                               (Ms[i] * Minf[j] + Minf[i] * Ms[j]) / finf;
                    P[i * n + j] = s;
                    P[j * n + i] = s;
                }
            *ll -= 0.5 * (LOG_2PI + log(finf));
            house_drop(w, n, k);
            k--;
            drop_residue(w, n, k, h, finf);
            /* the last diffuse direction resolved: with entries 0..p observing the whole state
               near noise-free, P from them directly (the later entries then see it) */
            if (whole && k == 0) observed_whole(w, n, p + 1, k_in, w->xp, w->xd, P);
            e->type = 2;
            e->f = finf;
            if (keep) {
                for (int i = 0; i < n; i++) {
                    w->K0[p * n + i] = Minf[i] / finf;
                    w->K1[p * n + i] = Ms[i] / finf - Minf[i] * c2;
                }
            }
            continue;
        }
        double tr = 0.0;
        for (int i = 0; i < n; i++) tr += P[i * n + i];
        if (!(fs > SKIP_TOL * hh * tr) || !(fs > 0.0)) continue; /* no information */
        for (int i = 0; i < n; i++) a[i] += Ms[i] * v / fs;
        /* the smoother's recomputation (keep) reads no P after the step's last entry */
        for (int i = 0; i < n && !(keep && p == o - 1); i++)
            for (int j = 0; j <= i; j++) {
                double s = P[i * n + j] - Ms[i] * Ms[j] / fs;
                P[i * n + j] = s;
                P[j * n + i] = s;
            }
        *ll -= 0.5 * (LOG_2PI + log(fs) + v * v / fs);
        e->type = 1;
        e->f = fs;
        if (keep)
            for (int i = 0; i < n; i++) w->K0[p * n + i] = Ms[i] / fs;
    }
    return k;
}

static KS_INLINE void DDt(int n, int k, const double *D, double *out) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0.0;
            for (int q = 0; q < k; q++) s += D[i * n + q] * D[j * n + q];
            out[i * n + j] = s;
            out[j * n + i] = s;
        }
}

/* Pd = U U' with U an orthonormal basis of range(D[:, :k]) (modified Gram-Schmidt, twice);
 * D row-major n x n, U and Pd n x n. */
static KS_INLINE void range_projector(int n, int k, const double *D, double *U, double *Pd) {
    for (int j = 0; j < k; j++) {
        for (int i = 0; i < n; i++) U[i * n + j] = D[i * n + j];
        for (int pass = 0; pass < 2; pass++)
            for (int q = 0; q < j; q++) {
                double s = 0.0;
                for (int i = 0; i < n; i++) s += U[i * n + q] * U[i * n + j];
                for (int i = 0; i < n; i++) U[i * n + j] -= s * U[i * n + q];
            }
        double s = 0.0;
        for (int i = 0; i < n; i++) s += U[i * n + j] * U[i * n + j];
        s = s > 0.0 ? 1.0 / sqrt(s) : 0.0;
        for (int i = 0; i < n; i++) U[i * n + j] *= s;
    }
    DDt(n, k, U, Pd);
}

/* out = Pk A Pk + tau Pd, symmetrized, Pk = I - Pd (tmp = Pk A = A - Pd A first; out may be A). */
static KS_INLINE void project_sandwich(int n, const double *A, const double *Pd, double *tmp,
                                       double *out, double tau) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = A[i * n + j];
            for (int q = 0; q < n; q++) s -= Pd[i * n + q] * A[q * n + j];
            tmp[i * n + j] = s;
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = tmp[i * n + j];
            for (int q = 0; q < n; q++) s -= tmp[i * n + q] * Pd[q * n + j];
            out[i * n + j] = s + tau * Pd[i * n + j];
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            double s = 0.5 * (out[i * n + j] + out[j * n + i]);
            out[i * n + j] = s;
            out[j * n + i] = s;
        }
}

/* Outputs of a step whose filtered state is still diffuse along range(D[:, :k]): the covariance
 * with +-inf where the projector Pd on that range is nonzero (above 64 eps) and the finite part
 * elsewhere, and the limit precision Pk (Pk P Pk + tau Pd)^-1 Pk, Pk = I - Pd, tau the largest
 * diagonal entry of Pk P Pk (any tau > 0 gives the same limit; a unit one beside a P of scale v
 * cost |log10 v| digits, 1e-4 relative at v = 1e-12). 0 if not invertible. */
static KS_INLINE int diffuse_outputs(ws_t *w, int n, int k, const double *P, double *cov, double *prec) {
    double *U = w->G, *Pd = w->Lr, *M = w->tmp2x;
    range_projector(n, k, w->D, U, Pd);
    const double tol = 64.0 * 2.220446049250313e-16;
    for (int i = 0; i < n * n; i++) cov[i] = fabs(Pd[i]) > tol ? copysign(INFINITY, Pd[i]) : P[i];
    /* M = Pk P Pk + tau Pd */
    project_sandwich(n, P, Pd, w->tmp, M, 0.0);
    double tau = 0.0;
    for (int i = 0; i < n; i++) tau = fmax(tau, M[i * n + i]);
    if (!(tau > 0.0) || !isfinite(tau)) tau = 1.0;
    for (int i = 0; i < n * n; i++) M[i] += tau * Pd[i];
    if (!prec_inverse(w, n, M, w->tmp, prec)) return 0;
    /* prec <- Pk prec Pk */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = prec[i * n + j];
            for (int q = 0; q < n; q++) s -= Pd[i * n + q] * prec[q * n + j];
            M[i * n + j] = s;
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = M[i * n + j];
            for (int q = 0; q < n; q++) s -= M[i * n + q] * Pd[q * n + j];
            prec[i * n + j] = s;
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            double s = 0.5 * (prec[i * n + j] + prec[j * n + i]);
            prec[i * n + j] = s;
            prec[j * n + i] = s;
        }
    return 1;
}


/* Lower semidefinite Cholesky factor of the PSD A (n x n) into L: a pivot at rounding level
 * of its own diagonal entry (s <= 1e-15 A_jj, the rounding of A_jj - sum L_jq^2) gives a zero
 * column. Judged per entry, as the factor of the equilibrated S A S (S = diag(A)^-1/2) would be:
 * a threshold relative to A's largest diagonal entry dropped a state of variance 1 beside one of
 * 1e16 (docs/dense.md, "Native path"). */
static KS_INLINE void semidef_chol(int n, const double *A, double *L) {
    for (int j = 0; j < n; j++) {
        double s = A[j * n + j];
        for (int q = 0; q < j; q++) s -= L[j * n + q] * L[j * n + q];
        double piv = s > 1e-15 * A[j * n + j] ? sqrt(s) : 0.0;
        L[j * n + j] = piv;
        for (int i = j + 1; i < n; i++) {
            double v = A[i * n + j];
            for (int q = 0; q < j; q++) v -= L[i * n + q] * L[j * n + q];
            L[i * n + j] = piv > 0.0 ? v / piv : 0.0;
        }
        for (int i = 0; i < j; i++) L[i * n + j] = 0.0;
    }
}

/* One Householder step on the row-major M (row stride ld): the reflection that zeroes column j
 * in rows r0..r1-1 against pivot row j, applied to columns j..c-1 of those rows (rows strictly
 * between j and r0 hold zeros in column j and are not touched). */
static KS_INLINE void house_step(double *M, int ld, int j, int r0, int r1, int c) {
    double scale = fabs(M[j * ld + j]);
    for (int i = r0; i < r1; i++) scale = fmax(scale, fabs(M[i * ld + j]));
    if (scale == 0.0) return;
    /* the reflection vector v = x - alpha e_1 kept scaled by 1/scale (over column j), so that a
       column at underflow level (rounding residue) does not give 2 / v'v = inf */
    double *rj = M + j * ld;
    double x0 = rj[j] / scale, nrm = x0 * x0;
    for (int i = r0; i < r1; i++) {
        double x = M[i * ld + j] / scale;
        M[i * ld + j] = x;
        nrm += x * x;
    }
    nrm = sqrt(nrm);
    double alpha = x0 > 0.0 ? -nrm : nrm, v0 = x0 - alpha;
    double beta = -1.0 / (alpha * v0); /* 2 / v'v */
    for (int q = j + 1; q < c; q++) {
        double sdot = v0 * rj[q];
        for (int i = r0; i < r1; i++) sdot += M[i * ld + j] * M[i * ld + q];
        sdot *= beta;
        rj[q] -= sdot * v0;
        for (int i = r0; i < r1; i++) M[i * ld + q] -= sdot * M[i * ld + j];
    }
    rj[j] = alpha * scale;
    for (int i = r0; i < r1; i++) M[i * ld + j] = 0.0;
}

/* Backward square-root information filter (two-filter smoother, docs/dense.md): the information
 * z_{t:T} carry about x_t as n rows [S | y] (row stride n + 1, S upper triangular, zero rows
 * carry nothing), S x_t = y + N(0, I). srif_obs adds the o decorrelated entries of step t
 * (rows h / sqrt(Dg); *hmax: the largest |h|^2 / Dg); 0 if an entry is noise-free (Dg = 0: no
 * square root). buf: (n + o) (n + 1) doubles. */
static KS_INLINE int srif_obs(int n, double *S, int o, const double *Hy, const double *y,
                                  const double *Dg, double *buf, double *hmax) {
    const int c = n + 1;
    if (o == 0) return 1;
    memcpy(buf, S, (size_t)n * c * sizeof(double));
    for (int p = 0; p < o; p++) {
        if (!(Dg[p] > 0.0)) return 0;
        double g = 1.0 / sqrt(Dg[p]), hh = 0.0;
        double *row = buf + (n + p) * c;
        for (int j = 0; j < n; j++) {
            row[j] = g * Hy[p * n + j];
            hh += row[j] * row[j];
        }
        if (hh > *hmax) *hmax = hh;
        row[n] = g * y[p];
    }
    for (int j = 0; j < n; j++) house_step(buf, c, j, n, n + o, c);
    memcpy(S, buf, (size_t)n * c * sizeof(double));
    return 1;
}

/* [S | y] from x_t back to x_{t-1} (x_t = F x_{t-1} + c + Lq w, w ~ N(0, I_q), Lq Lq' = Q with
 * Q's q nonzero Cholesky columns): the rows [[I_q, 0, 0], [S Lq, S F, y - S c]] triangularized,
 * w eliminated. buf: (2n)(2n + 1) + n^2 doubles. */
static KS_INLINE void srif_back(int n, double *S, const double *F, const double *Q,
                                    const double *cvec, double *buf) {
    double *Lq = buf + 2 * n * (2 * n + 1);
    semidef_chol(n, Q, Lq);
    int q = 0;
    for (int j = 0; j < n; j++) /* compact Q's nonzero columns to the left */
        if (Lq[j * n + j] > 0.0) {
            for (int i = 0; i < n; i++) Lq[i * n + q] = Lq[i * n + j];
            q++;
        }
    const int c = q + n + 1, r = q + n;
    memset(buf, 0, (size_t)r * c * sizeof(double));
    for (int i = 0; i < q; i++) buf[i * c + i] = 1.0;
    for (int i = 0; i < n; i++) {
        const double *si = S + i * (n + 1);
        double *row = buf + (q + i) * c;
        double yc = si[n];
        for (int p = 0; p < n; p++) yc -= si[p] * cvec[p];
        for (int j = 0; j < q; j++) {
            double a = 0.0;
            for (int p = i; p < n; p++) a += si[p] * Lq[p * n + j];
            row[j] = a;
        }
        for (int j = 0; j < n; j++) {
            double f = 0.0;
            for (int p = i; p < n; p++) f += si[p] * F[p * n + j];
            row[q + j] = f;
        }
        row[q + n] = yc;
    }
    for (int j = 0; j < q; j++) house_step(buf, c, j, q, r, c);
    for (int j = q; j < r; j++) house_step(buf, c, j, j + 1, r, c);
    for (int i = 0; i < n; i++) {
        memcpy(S + i * (n + 1), buf + (q + i) * c + q, (n + 1) * sizeof(double));
        for (int j = 0; j < i; j++) S[i * (n + 1) + j] = 0.0;
    }
}

/* [S | y] of z_{t:T} about x_t from Durbin & Koopman's r, N at step t (prediction a, P; smoothed
 * mean a + P r, covariance P - P N P): the information J = (I - N P)^-1 N and its vector j,
 * j - J a = (I - N P)^-1 r = u (the two-filter combination of N(a, P) with J, j solved for J, j),
 * S = W' and y = W' a + W^-1 u from the semidefinite Cholesky factor W W' = J (zero rows where W has a
 * zero pivot). Used at the first non-diffuse step, so that the square-root filter runs over the
 * diffuse steps only. 0 if I - N P is singular. buf: 3 n^2 + 2 n doubles. */
static KS_INLINE int srif_from_dk(int n, const double *N, const double *r, const double *a,
                                      const double *P, double *buf, double *S) {
    const int nn = n * n, c = n + 1;
    double *A = buf, *X = A + nn, *W = X + nn, *jv = W + nn, *u = jv + n;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = i == j ? 1.0 : 0.0;
            for (int q = 0; q < n; q++) s -= N[i * n + q] * P[q * n + j];
            A[i * n + j] = s;
        }
    /* X = (I - N P)^-1 [N | r]: the vector rides in the solve's B as column 0 of a second pass */
    memcpy(X, N, nn * sizeof(double));
    double *A2 = W; /* W is free until the factorization */
    memcpy(A2, A, nn * sizeof(double));
    if (!solve(n, A, X)) return 0;
    memset(A, 0, nn * sizeof(double));
    for (int i = 0; i < n; i++) A[i * n] = r[i];
    if (!solve(n, A2, A)) return 0;
    for (int i = 0; i < n; i++) u[i] = A[i * n];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            double v = 0.5 * (X[i * n + j] + X[j * n + i]);
            X[i * n + j] = v;
            X[j * n + i] = v;
        }
    semidef_chol(n, X, W);
    /* y = W' a + W^-1 u: the part along a kept apart from the solve (J a through W^-1 would
       carry W's conditioning into y - S a) */
    for (int i = 0; i < n; i++) {
        double s = u[i];
        for (int q = 0; q < i; q++) s -= W[i * n + q] * jv[q];
        double piv = W[i * n + i];
        jv[i] = piv > 0.0 ? s / piv : 0.0;
    }
    for (int i = 0; i < n; i++) {
        double s = jv[i];
        for (int j = i; j < n; j++) s += W[j * n + i] * a[j];
        S[i * c + n] = s;
        for (int j = 0; j < n; j++) S[i * c + j] = j >= i ? W[j * n + i] : 0.0;
    }
    return 1;
}

/* Smoothed moments at a diffuse step from the prediction x_t = a + L u + D v (L L' = P,
 * u ~ N(0, I), v flat along D's k columns) and the n rows [S | y] of z_{t:T}: the least-squares
 * problem [[I, 0], [S L, S D]] (u, v) = (0, y - S a) triangularized to Rt (u, v) = rhs, mean
 * a + G Rt^-1 rhs and covariance X'X, X = Rt^-T G', G = [L, D]: orthogonal steps and a sum of
 * squares only. 0 if Rt is singular (a direction not resolved by z_{t:T}). buf: 9 n^2 + 4 n
 * doubles. */
static KS_INLINE int srif_smoothed(int n, const double *S, int k, const double *a,
                                       const double *P, const double *D, double *buf,
                                       double *mean, double *V, int fin) {
    const int mk = n + k, c = mk + 1, ni = fin ? mk : n, r = ni + n, m = n;
    double *M = buf, *G = M + 3 * n * (2 * n + 1), *X = G + 2 * n * n, *L = X + 2 * n * n + 2 * n;
    semidef_chol(n, P, L);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) G[i * mk + j] = L[i * n + j];
        for (int j = 0; j < k; j++) G[i * mk + n + j] = D[i * n + j];
    }
    memset(M, 0, (size_t)r * c * sizeof(double));
    for (int i = 0; i < ni; i++) M[i * c + i] = 1.0;
    for (int i = 0; i < m; i++) {
        const double *si = S + i * (n + 1);
        double *row = M + (ni + i) * c;
        double ya = si[n];
        for (int q = 0; q < n; q++) ya -= si[q] * a[q];
        for (int j = 0; j < mk; j++) {
            double s = 0.0;
            for (int q = i; q < n; q++) s += si[q] * G[q * mk + j];
            row[j] = s;
        }
        row[mk] = ya;
    }
    for (int j = 0; j < ni; j++) house_step(M, c, j, ni, r, c);
    for (int j = ni; j < mk; j++) house_step(M, c, j, j + 1, r, c);
    for (int j = 0; j < mk; j++)
        if (!(fabs(M[j * c + j]) > 0.0)) return 0;
    double *uv = X + mk * n; /* past X's (n + k) x n block */
    for (int j = mk - 1; j >= 0; j--) {
        double s = M[j * c + mk];
        for (int q = j + 1; q < mk; q++) s -= M[j * c + q] * uv[q];
        uv[j] = s / M[j * c + j];
    }
    for (int i = 0; i < n; i++) {
        double s = a[i];
        for (int j = 0; j < mk; j++) s += G[i * mk + j] * uv[j];
        mean[i] = s;
    }
    for (int i = 0; i < n; i++) /* column i of X: Rt' X_i = (row i of G)' */
        for (int j = 0; j < mk; j++) {
            double v = G[i * mk + j];
            for (int q = 0; q < j; q++) v -= M[q * c + j] * X[q * n + i];
            X[j * n + i] = v / M[j * c + j];
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0.0;
            for (int q = 0; q < mk; q++) s += X[q * n + i] * X[q * n + j];
            V[i * n + j] = s;
            V[j * n + i] = s;
        }
    return 1;
}

/* The smoothed covariance in square-root information form: with the prediction
 * x_t = a + L u + D v (P = L L', u ~ N(0, I), v flat along the k columns of D) and the information
 * J that z_{t:T} carry about x_t, V = G Lam^-1 G', G = [L, D], Lam = diag(1_n, 0_k) + G' J G,
 * computed as X'X with X = C^-1 G' (Lam = C C'): a sum of squares, no difference of nearly equal
 * matrices. buf holds 11 n^2 doubles. *cond: the largest ratio of a diagonal entry of Lam to its
 * Cholesky pivot (the pivots' relative rounding is eps times it: a huge information direction
 * next to O(1) ones cancels there). 0 if Lam is not positive definite (a direction left
 * diffuse). */
static KS_INLINE int info_smoothed_cov(int n, int k, const double *P, const double *D, const double *J,
                             double *buf, double *V, double *cond) {
    const int m = n + k;
    double *L = buf, *G = L + n * n, *JG = G + 2 * n * n, *Lam = JG + 2 * n * n,
           *X = Lam + 4 * n * n;
    semidef_chol(n, P, L);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) G[i * m + j] = L[i * n + j];
        for (int j = 0; j < k; j++) G[i * m + n + j] = D[i * n + j];
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int q = 0; q < n; q++) s += J[i * n + q] * G[q * m + j];
            JG[i * m + j] = s;
        }
    for (int i = 0; i < m; i++)
        for (int j = 0; j <= i; j++) {
            double s = i == j && i < n ? 1.0 : 0.0;
            for (int q = 0; q < n; q++) s += 0.5 * (G[q * m + i] * JG[q * m + j] + G[q * m + j] * JG[q * m + i]);
            Lam[i * m + j] = s;
        }
    for (int j = 0; j < m; j++) { /* Lam = C C', C lower, in place */
        double s = Lam[j * m + j];
        for (int q = 0; q < j; q++) s -= Lam[j * m + q] * Lam[j * m + q];
        if (!(s > 0.0)) return 0;
        double c = sqrt(s);
        if (Lam[j * m + j] / s > *cond) *cond = Lam[j * m + j] / s;
        Lam[j * m + j] = c;
        for (int i = j + 1; i < m; i++) {
            double v = Lam[i * m + j];
            for (int q = 0; q < j; q++) v -= Lam[i * m + q] * Lam[j * m + q];
            Lam[i * m + j] = v / c;
        }
    }
    for (int i = 0; i < n; i++) /* column i of X = C^-1 (row i of G)' */
        for (int j = 0; j < m; j++) {
            double v = G[i * m + j];
            for (int q = 0; q < j; q++) v -= Lam[j * m + q] * X[q * n + i];
            X[j * n + i] = v / Lam[j * m + j];
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0.0;
            for (int q = 0; q < m; q++) s += X[q * n + i] * X[q * n + j];
            V[i * n + j] = s;
            V[j * n + i] = s;
        }
    return 1;
}

/* How many of the o gathered entries are near noise-free (|h|^2 tr(P) > NEAR_STEP Dg); 0 when
 * fewer than two: processed one at a time in covariance form, the second would see the first's
 * rounding at |P| eps next to a direction known to Dg (docs/dense.md, "Native path"). O(n o). */
static KS_INLINE int near_step(const ws_t *w, const int n, int o, const double *P) {
    if (o < 2) return 0;
    double tr = 0.0;
    for (int i = 0; i < n; i++) tr += P[i * n + i];
    int c = 0;
    for (int p = 0; p < o; p++) {
        const double *h = w->Hy + p * n;
        double hh = 0.0;
        for (int j = 0; j < n; j++) hh += h[j] * h[j];
        if (hh * tr > NEAR_STEP * w->Dg[p]) c++;
    }
    return c >= 2 ? c : 0;
}

/* P -> the factor D (its nonzero semidefinite Cholesky columns) and P = 0; returns their number. */
static KS_INLINE int to_factor(ws_t *w, const int n, double *P) {
    double *L = w->tmp, *D = w->D;
    semidef_chol(n, P, L);
    int k = 0;
    for (int j = 0; j < n; j++)
        if (L[j * n + j] > 0.0) {
            for (int i = 0; i < n; i++) D[i * n + k] = L[i * n + j];
            k++;
        }
    for (int i = 0; i < n; i++)
        for (int j = k; j < n; j++) D[i * n + j] = 0.0;
    memset(P, 0, (size_t)n * n * sizeof(double));
    return k;
}

/* P += D D' (k columns) and D = 0. */
static KS_INLINE void fold_factor(ws_t *w, const int n, int k, double *P) {
    const int nn = n * n;
    if (k > 0) {
        DDt(n, k, w->D, w->tmp);
        for (int i = 0; i < nn; i++) P[i] += w->tmp[i];
    }
    for (int i = 0; i < nn; i++) w->D[i] = 0.0;
}

/* The finite part once the entries 0..o-1 of a diffuse step, all with noise (Dg > 0), resolved every
 * diffuse direction and observe the whole state (whitened rows W = Dg^-1/2 Hy of rank n): with
 * C = (W'W)^-1 (from the QR of W) and Pd the projector on range(Dp[:, :kb]) (the prediction's
 * diffuse directions), C - C X C, X = (Pk (C + Pp) Pk + Pd)^-1 - Pd, Pk = I - Pd: the update of
 * N(., C) by the prediction seen outside its diffuse directions (X = Z (Z' (C + Pp) Z)^-1 Z', Z
 * a basis of Pk's range). The scalar updates form this O(|C|) result as a difference of O(|Pp|)
 * terms (relative error eps |Pp| / |C|: 4e-5 at R = 1e-12 I on random 2-state models); here C
 * carries it and the correction is at most |C| / |Pp| of it. Written to P and 1 returned where
 * W has numerical rank n and tr of the result is at most WHOLE_RATIO tr(Pp); else 0, P untouched.
 * Scratch: xw (o n), xc, xx, xu, xl (n^2 each). */
static KS_INLINE int observed_whole(ws_t *w, const int n, int o, int kb, const double *Pp,
                                    const double *Dp, double *P) {
    const int nn = n * n;
    double *W = w->xw, *C = w->xc, *X = w->xx, *U = w->xu, *L = w->xl;
    if (o < n || kb <= 0) return 0;
    for (int p = 0; p < o; p++) {
        if (!(w->Dg[p] > 0.0)) return 0;
        double g = 1.0 / sqrt(w->Dg[p]);
        for (int j = 0; j < n; j++) W[p * n + j] = g * w->Hy[p * n + j];
    }
    for (int j = 0; j < n; j++) house_step(W, n, j, j + 1, o, n); /* rows 0..n-1: upper Rw */
    double dmin = INFINITY, dmax = 0.0;
    for (int j = 0; j < n; j++) {
        double v = fabs(W[j * n + j]);
        dmin = fmin(dmin, v);
        dmax = fmax(dmax, v);
    }
    if (!(dmin > 1e-7 * dmax)) return 0;
    /* L = Rw^-1 (upper), column by column; C = L L' */
    for (int j = 0; j < n; j++)
        for (int i = n - 1; i >= 0; i--) {
            double s = i == j ? 1.0 : 0.0;
            for (int q = i + 1; q < n; q++) s -= W[i * n + q] * L[q * n + j];
            L[i * n + j] = i > j ? 0.0 : s / W[i * n + i];
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0.0;
            for (int q = (i > j ? i : j); q < n; q++) s += L[i * n + q] * L[j * n + q];
            C[i * n + j] = s;
            C[j * n + i] = s;
        }
    /* U: orthonormal basis of range(Dp[:, :kb]) (modified Gram-Schmidt, twice); Pd = U U' in L */
    double *Pd = L;
    range_projector(n, kb, Dp, U, Pd);
    /* X = Pk (C + Pp) Pk + Pd (U: scratch) */
    for (int i = 0; i < n * n; i++) X[i] = C[i] + Pp[i];
    project_sandwich(n, X, Pd, U, X, 1.0);
    if (!spd_inverse(n, X, W, U)) return 0; /* U = X^-1 (W: scratch, o >= n rows) */
    for (int i = 0; i < nn; i++) U[i] -= Pd[i];
    /* P = C - C U C; X = C U */
    mm(n, C, U, X);
    double trp = 0.0, trn = 0.0;
    for (int i = 0; i < n; i++) trp += Pp[i * n + i];
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0.0;
            for (int q = 0; q < n; q++) s += X[i * n + q] * C[q * n + j];
            L[i * n + j] = C[i * n + j] - s; /* lower triangle; Pd is no longer needed */
        }
    for (int i = 0; i < n; i++) trn += L[i * n + i];
    if (!(trn <= WHOLE_RATIO * trp)) return 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            P[i * n + j] = L[i * n + j];
            P[j * n + i] = L[i * n + j];
        }
    return 1;
}

/* The square-root rows' error level with a near noise-free entry, hq = max |h|^2 / Dg times
 * max |Q|: 1e3 eps sqrt(hq) (measured up to 160 eps sqrt(hq) in the covariances and 750 in the
 * means on random 3-state models at R = 1e-10, 1e-12), at most 2.5e-8 (KFAS's VAR(1) with a
 * rotated H at R = 1e-12: the rows 2.1e-8 off, the diffuse terms 8e-14). */
static KS_INLINE double near_tol(double hq) { return fmin(1e3 * DBL_EPSILON * sqrt(hq), 2.5e-8); }

/* Whether the smoothed moments (m1, V1) agree with (m2, V2) to within tol: covariances normwise
 * relative, means in V2's standard deviations. */
static KS_INLINE int agree(int n, const double *m1, const double *V1, const double *m2,
                           const double *V2, double tol) {
    double dv = 0.0, nv = 0.0;
    for (int i = 0; i < n * n; i++) {
        dv += (V1[i] - V2[i]) * (V1[i] - V2[i]);
        nv += V2[i] * V2[i];
    }
    if (!(dv <= tol * tol * nv)) return 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(m1[i] - m2[i]), sd = sqrt(fmax(V2[i * n + i], 0.0));
        if (!(e <= tol * sd)) return 0;
    }
    return 1;
}

/* A large prior's head: the stored predicted covariances hold the part P_s outside the finite
 * factor (the smoother reads them so); the outputs get P_s + D D' once it is done. */
static KS_INLINE void add_factor(int n, Py_ssize_t nh, double *pcov, const double *pD,
                                 const double *pK, double *tmp) {
    const int nn = n * n;
    for (Py_ssize_t t = 0; t < nh; t++) {
        DDt(n, (int)pK[t], pD + t * nn, tmp);
        for (int i = 0; i < nn; i++) pcov[t * nn + i] += tmp[i];
    }
}

/* One series: filter (and smoother). Returns the number of leading steps with a diffuse filtered
 * state (T + 1 if some direction is never resolved), or -1 on allocation failure. fin: D0 is the
 * factor of a large proper prior (P0 = 0 then), not diffuse directions: the finite head (the file's
 * comment). */
/* Whether the precision's screen runs for series b (the gate of kalmanscan/dense/singular.py):
 * F or Q varying in time; a direction F' and Q both map to 0 (null(F F' + Q): with no direction
 * known before and no exact entry, the directions known at a step are null(Q) and those F' maps
 * into the ones known a step before, empty at every step unless this is not); a singular proper
 * prior (w->P, plus w->D's k columns for a large one's factor). An exact entry turns it on later
 * (gather). Once per series, not inlined. */
static KS_NOINLINE int series_screen(ws_t *w, int n, const arr_t *in, Py_ssize_t b, int k, int fin) {
    if (in[I_F].st != 0 || in[I_Q].st != 0) return 1;
    const double *F0 = mat(&in[I_F], b, 0), *Q0 = mat(&in[I_Q], b, 0);
    double *M = w->tmp2x;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = Q0[i * n + j];
            for (int q = 0; q < n; q++) s += F0[i * n + q] * F0[j * n + q];
            M[i * n + j] = s;
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) M[i * n + j] = M[j * n + i] = 0.5 * (M[i * n + j] + M[j * n + i]);
    if (!spd_inverse(n, M, w->tmp, w->G) || near_singular(n, M, w->G)) return 1;
    if (!fin && k > 0) return 0; /* a diffuse prior: no direction of its finite part is known */
    DDt(n, k, w->D, M);
    for (int i = 0; i < n * n; i++) M[i] += w->P[i];
    return !spd_inverse(n, M, w->tmp, w->G) || near_singular(n, M, w->G);
}

static KS_INLINE Py_ssize_t run_series(ws_t *w, const int n, const arr_t *in, double **out, const double *m0,
                             const double *P0, const double *D0, Py_ssize_t b, Py_ssize_t T,
                             Py_ssize_t kcap, int smooth, int fin, Py_ssize_t *npred,
                             Py_ssize_t *nbad) {
    const int nn = n * n;
    double *m = w->m, *P = w->P, *D = w->D;
    memcpy(m, m0, n * sizeof(double));
    memcpy(P, P0, nn * sizeof(double));
    int k = 0;
    for (int j = 0; j < n; j++) { /* compact the nonzero columns of D0 */
        double s = 0.0;
        for (int i = 0; i < n; i++) s += D0[i * n + j] * D0[i * n + j];
        if (s > 0.0) {
            for (int i = 0; i < n; i++) D[i * n + k] = D0[i * n + j];
            k++;
        }
    }
    for (int i = 0; i < n; i++)
        for (int j = k; j < n; j++) D[i * n + j] = 0.0;
    w->screen = series_screen(w, n, in, b, k, fin);
    Py_ssize_t nd = 0, np_ = 0, nfs = 0; /* nfs: steps whose entries ran on the factor of P */
    Py_ssize_t nterm = 0; /* entries whose term is a proper density (type 1): scale -log s each */
    double llsum = 0.0;
    double *ll = out[O_LL] + b;
    const int ll_only = smooth < 0; /* the log-likelihood alone: no per-step output is written */
    double *fmean = NULL, *fcov = NULL, *fprec = NULL, *pmean = NULL, *pcov = NULL;
    double *pD = NULL, *pK = NULL;
    unsigned char *flag = NULL;
    if (!ll_only) {
        fmean = out[O_FMEAN] + b * T * n;
        fcov = out[O_FCOV] + b * T * nn;
        fprec = out[O_FPREC] + b * T * nn;
        pmean = out[O_PMEAN] + b * T * n;
        pcov = out[O_PCOV] + b * T * nn;
        flag = (unsigned char *)out[O_FLAG] + b * T;
        pD = out[O_PD] + b * kcap * nn;
        pK = out[O_PK] + b * kcap;
    }
    w->fcur = NULL;
    for (Py_ssize_t t = 0; t < T; t++) {
        load_F(w, n, mat(&in[I_F], b, t));
        const double *c = mat(&in[I_C], b, t);
        double *a = ll_only ? w->a : pmean + t * n;
        F_mv(w, n, m, a);
        for (int i = 0; i < n; i++) a[i] += c[i];
        predict_cov(w, n, P, mat(&in[I_Q], b, t));
        if (!ll_only) memcpy(pcov + t * nn, P, nn * sizeof(double));
        if (k > 0) {
            F_mm(w, n, D, k, w->tmp);
            if (!fin) k = factor_basis(w, n, k);
            for (int i = 0; i < n; i++) memcpy(D + i * n, w->tmp + i * n, k * sizeof(double));
            if (!ll_only && t < kcap) {
                memcpy(pD + t * nn, D, nn * sizeof(double));
                pK[t] = k;
            }
            np_ = t + 1;
        }
        memcpy(m, a, n * sizeof(double));
        double lt = 0.0;
        int o = gather(w, n, in, b, t, k, !fin);
        int fstep = k == 0 && near_step(w, n, o, P);
        if (fstep) { /* the step's entries on the factor of P (exact, as a large prior's) */
            k = to_factor(w, n, P);
            nfs++;
        } else if (fin && k > 0 && near_step(w, n, o, P) >= n) {
            /* a large prior's head with the whole state near noise-free: P (O(Q)) beside the
               factor would cancel like Q / Dg; the whole covariance on one factor instead (its
               rounding, eps |D|^2, is what the entries' information 1 / Dg makes negligible) */
            fold_factor(w, n, k, P);
            k = to_factor(w, n, P);
            nfs++;
        }
        int k_before = k;
        const int whole = !fin && !fstep && k > 0 && o >= n; /* observed_whole may serve */
        if (whole) {
            memcpy(w->xp, P, nn * sizeof(double));
            memcpy(w->xd, D, nn * sizeof(double));
        }
        k = update(w, n, o, m, P, k, &lt, 0, fin || fstep, whole);
        for (int p = 0; p < o; p++) nterm += w->el[p].type == 1;
        if (fstep) {
            fold_factor(w, n, k, P);
            k = 0;
            k_before = 0;
        }
        if (k < k_before && !fin) lt += pdet_term(w->sig, k_before - k);
        llsum += lt;
        if (fin && k > 0) { /* the factor no longer dominates: fold it into P */
            double dd = 0.0, tr = 0.0;
            for (int i = 0; i < n; i++) {
                tr += P[i * n + i];
                for (int j = 0; j < k; j++) dd += D[i * n + j] * D[i * n + j];
            }
            if (dd <= FIN_FOLD * tr) {
                DDt(n, k, D, w->tmp);
                for (int i = 0; i < nn; i++) P[i] += w->tmp[i];
                for (int i = 0; i < nn; i++) D[i] = 0.0;
                k = 0;
            }
        }
        if (ll_only) {
            if (k > 0 && !fin) nd = t + 1;
            continue;
        }
        memcpy(fmean + t * n, m, n * sizeof(double));
        flag[t] = k > 0 && !fin;
        if (k > 0 && fin) { /* P + D D', finite */
            double *fc = fcov + t * nn;
            DDt(n, k, D, fc);
            for (int i = 0; i < nn; i++) fc[i] += P[i];
            if (!prec_inverse(w, n, fc, w->tmp, fprec + t * nn)) {
                for (int i = 0; i < nn; i++) fprec[t * nn + i] = NAN;
                (*nbad)++;
            }
        } else if (k > 0) {
            nd = t + 1;
            if (!diffuse_outputs(w, n, k, P, fcov + t * nn, fprec + t * nn)) {
                for (int i = 0; i < nn; i++) fprec[t * nn + i] = NAN;
                (*nbad)++;
            }
        } else {
            memcpy(fcov + t * nn, P, nn * sizeof(double));
            if (!prec_inverse(w, n, P, w->tmp, fprec + t * nn)) {
                for (int i = 0; i < nn; i++) fprec[t * nn + i] = NAN;
                (*nbad)++;
            }
        }
    }
    *ll = llsum;
    if (out[O_NTERM]) out[O_NTERM][b] = (double)nterm;
    if (k > 0 && !fin) nd = T + 1;
    *npred = np_;
    if (smooth <= 0 || nd > T || np_ > kcap) {
        if (fin && !ll_only && np_ <= kcap) add_factor(n, np_, pcov, pD, pK, w->tmp);
        return nd;
    }

    /* backward: r0, N0 (and r1, N1, N2 in diffuse steps) */
    double *r0 = calloc(2 * n + 20 * nn, sizeof(double));
    if (!r0) return -1;
    double *r1 = r0 + n, *N0 = r1 + n, *N1 = N0 + nn, *N2 = N1 + nn;
    /* information form for the first steps when a large prior makes P - P N P cancel: J (the
       information z_{t:T} carry about x_t), the last step where the DK form was accurate */
    double *J = N2 + nn, *Ng = J + nn, *Pg = Ng + nn, *Ab = Pg + nn, *Vi = Ab + nn;
    double *ibuf = Vi + nn; /* 11 n^2 for info_smoothed_cov */
    int info = 0, info_failed = 0;
    Py_ssize_t tg = T; /* past the end: J = 0 */
    double jcond = 0.0; /* largest |J| |Q| (or |N| |P| of the conversion) met carrying J back */
    double *smean = out[O_SMEAN] + b * T * n, *scov = out[O_SCOV] + b * T * nn;
    double *sprec = out[O_SPREC] + b * T * nn;
    double *x = w->tmp2, *V = w->G, *Pinf = w->Lr; /* G and Lr are free here */
    /* the diffuse steps' moments from the backward square-root information filter when the
       start is diffuse, its rows set at step np_ from r0, N0 and carried back over the diffuse
       steps (0 once a noise-free or near noise-free entry is met anywhere: the DK form) */
    const Py_ssize_t nh = np_;             /* steps with a factor D: diffuse or a large prior's */
    const Py_ssize_t ndk = fin ? 0 : np_;  /* diffuse steps (Durbin & Koopman's diffuse terms) */
    /* steps with two near noise-free entries (near_step): the rows run from the end over the
       whole series and serve every step where Durbin & Koopman's form disagrees with them */
    const int rows_all = nfs > 0;
    int srif = nh > 0 || rows_all;
    int near = rows_all; /* a near noise-free entry (|h|^2 |Q| / Dg > INFO_COND): rows from the end */
    double hmax = 0.0, qmax = 0.0; /* max |h|^2 / Dg and max |Q| met so far */
    const double *qseen = NULL; /* the Q last folded into qmax */
    double *Srif = NULL, *sbuf = NULL, *Nc = NULL, *rc = NULL;
    Py_ssize_t tc = T; /* the step whose r0, N0 (Nc, rc) set the rows; T: from nothing */
    /* the information form's stretch at proper steps also as square-root rows Sp (from the
       same r, N as J): V from them, not (I + P J)^-1 P, whose rounding grows like |P| |J| */
    int psrif = 0;
    double *Sp, *rg, *Pf; /* Pf: a large prior's predicted P_s + D D' (fin) */
    {
        size_t wk = (size_t)(n + w->d) * (n + 1), wk2 = (size_t)11 * nn + 5 * n;
        Srif = calloc((size_t)2 * n * (n + 1) + 2 * nn + 2 * n + (wk > wk2 ? wk : wk2),
                      sizeof(double));
        if (!Srif) {
            free(r0);
            return -1;
        }
        Nc = Srif + n * (n + 1);
        rc = Nc + nn;
        Sp = rc + n;
        rg = Sp + n * (n + 1);
        Pf = rg + n;
        sbuf = Pf + nn;
    }
    for (Py_ssize_t t = T - 1; t >= 0; t--) {
        const double *a0 = pmean + t * n, *P0t = pcov + t * nn;
        int kt = 0;
        if (t < nh) {
            kt = (int)pK[t];
            memcpy(D, pD + t * nn, nn * sizeof(double));
        }
        if (fin && t < nh) { /* the proper form's recursions see the whole covariance */
            DDt(n, kt, D, Pf);
            for (int i = 0; i < nn; i++) Pf[i] += P0t[i];
            P0t = Pf;
        }
        const int ktd = fin ? 0 : kt;
        memcpy(m, a0, n * sizeof(double));
        memcpy(P, P0t, nn * sizeof(double));
        double dummy = 0.0;
        if (srif && t == nh - 1 && !rows_all) {
            /* the square-root filter's rows: from r0, N0 at tc (the information z_{tc:T} carry
               about x_tc, the last step back where they convert accurately; from nothing past
               the end if none did), carried back to the head. With a near noise-free entry, or
               a large prior's head, from the end: r0, N0 carry 1/Dg-sized terms next to O(1)
               ones and the conversion loses what the square-root rows keep */
            for (Py_ssize_t u = 0; u <= t; u++) {
                int ou = gather(w, n, in, b, u, 0, 0);
                for (int p = 0; p < ou; p++) {
                    const double *h = w->Hy + p * n;
                    double hh = 0.0;
                    for (int j = 0; j < n; j++) hh += h[j] * h[j];
                    if (w->Dg[p] > 0.0 && hh / w->Dg[p] > hmax) hmax = hh / w->Dg[p];
                }
                if (u > 0) {
                    const double *Qu = mat(&in[I_Q], b, u);
                    for (int i = 0; i < nn; i++) qmax = fmax(qmax, fabs(Qu[i]));
                }
            }
            near = hmax * qmax > INFO_COND;
            Py_ssize_t t1 = T - 1;
            if (tc < T && !near && !fin) {
                srif = srif_from_dk(n, Nc, rc, pmean + tc * n, pcov + tc * nn, sbuf, Srif);
                if (srif)
                    srif_back(n, Srif, mat(&in[I_F], b, tc), mat(&in[I_Q], b, tc),
                              mat(&in[I_C], b, tc), sbuf);
                t1 = tc - 1;
            }
            for (Py_ssize_t u = t1; u >= nh && srif; u--) {
                int ou = gather(w, n, in, b, u, 0, 0);
                srif = srif_obs(n, Srif, ou, w->Hy, w->y, w->Dg, sbuf, &hmax);
                if (srif)
                    srif_back(n, Srif, mat(&in[I_F], b, u), mat(&in[I_Q], b, u),
                              mat(&in[I_C], b, u), sbuf);
            }
        }
        int o = gather(w, n, in, b, t, 0, 0);
        if (srif && (t < nh || rows_all)) {
            srif = srif_obs(n, Srif, o, w->Hy, w->y, w->Dg, sbuf, &hmax);
        } else if (srif) { /* rows set at step nh: only the entries' scales here */
            for (int p = 0; p < o && srif; p++) {
                const double *h = w->Hy + p * n;
                double hh = 0.0;
                for (int j = 0; j < n; j++) hh += h[j] * h[j];
                if (!(w->Dg[p] > 0.0)) srif = 0;
                else if (hh / w->Dg[p] > hmax) hmax = hh / w->Dg[p];
            }
        }
        if (srif && t > 0) {
            const double *Qt = mat(&in[I_Q], b, t);
            if (Qt != qseen) { /* a time-invariant Q: once */
                for (int i = 0; i < nn; i++) qmax = fmax(qmax, fabs(Qt[i]));
                qseen = Qt;
            }
        }
        /* the filter's decision (the same P and entries): the step's entries on the factor */
        const int fs_t = ktd == 0 && t >= nh && near_step(w, n, o, P);
        const int whole_t = !fin && !fs_t && ktd > 0 && o >= n;
        if (whole_t) {
            memcpy(w->xp, P, nn * sizeof(double));
            memcpy(w->xd, D, nn * sizeof(double));
        }
        update(w, n, o, m, P, fs_t ? to_factor(w, n, P) : ktd, &dummy, 1, fs_t, whole_t);
        for (int p = o - 1; p >= 0; p--) {
            const elem_t *e = &w->el[p];
            if (e->type == 0) continue;
            const double *h = w->Hy + p * n, *K0 = w->K0 + p * n;
            /* L0 = I - K0 h': L0' r = r - h (K0' r); L0' N L0 = N - h q' - q h' + (K0' N K0) h h',
               q = N K0 */
            double kr0 = 0.0;
            for (int i = 0; i < n; i++) kr0 += K0[i] * r0[i];
            if (e->type == 1) {
                for (int i = 0; i < n; i++) r0[i] += h[i] * (e->v / e->f - kr0);
                double *mats[3] = {N0, N1, N2};
                int nm = ktd > 0 || t < ndk ? 3 : 1;
                if (t < ndk) {
                    double kr1 = 0.0;
                    for (int i = 0; i < n; i++) kr1 += K0[i] * r1[i];
                    for (int i = 0; i < n; i++) r1[i] -= h[i] * kr1;
                }
                for (int q = 0; q < nm; q++) {
                    double *N = mats[q];
                    double kNk = 0.0;
                    for (int i = 0; i < n; i++) {
                        double s = 0.0;
                        for (int j = 0; j < n; j++) s += N[i * n + j] * K0[j];
                        x[i] = s;
                        kNk += K0[i] * s;
                    }
                    double add = q == 0 ? 1.0 / e->f : 0.0;
                    rank2_update(n, N, h, x, kNk + add);
                }
            } else { /* diffuse entry: L0 = I - K0 h', L1 = -K1 h' */
                const double *K1 = w->K1 + p * n;
                double kr1 = 0.0, k1r0 = 0.0;
                for (int i = 0; i < n; i++) {
                    kr1 += K0[i] * r1[i];
                    k1r0 += K1[i] * r0[i];
                }
                /* r1 <- h v/finf + L0' r1 + L1' r0 ; r0 <- L0' r0 */
                for (int i = 0; i < n; i++) {
                    r1[i] += h[i] * (e->v / e->f - kr1 - k1r0);
                    r0[i] -= h[i] * kr0;
                }
                /* with A = L0, B = L1 (rank-one corrections along h):
                   N2 <- -fs/finf^2 hh' + A'N2A + A'N1B + B'N1A + B'N0B
                   N1 <- hh'/finf + A'N1A + B'N0A + A'N0B
                   N0 <- A'N0A.  X'NY for X = I - k h', Y = -j h' etc. expanded below. */
                double *x0 = x, *y0 = x + n, *x1 = V, *y1 = V + n, *z1 = V + 2 * n;
                /* x0 = N0 K0, y0 = N0 K1, x1 = N1 K0, y1 = N1 K1, z1 = N2 K0 */
                double k0N0k0 = 0, k1N0k1 = 0, k0N0k1 = 0, k0N1k0 = 0, k0N1k1 = 0, k0N2k0 = 0;
                for (int i = 0; i < n; i++) {
                    double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0;
                    for (int j = 0; j < n; j++) {
                        s0 += N0[i * n + j] * K0[j];
                        s1 += N0[i * n + j] * K1[j];
                        s2 += N1[i * n + j] * K0[j];
                        s3 += N1[i * n + j] * K1[j];
                        s4 += N2[i * n + j] * K0[j];
                    }
                    x0[i] = s0; y0[i] = s1; x1[i] = s2; y1[i] = s3; z1[i] = s4;
                }
                for (int i = 0; i < n; i++) {
                    k0N0k0 += K0[i] * x0[i];
                    k1N0k1 += K1[i] * y0[i];
                    k0N0k1 += K0[i] * y0[i];
                    k0N1k0 += K0[i] * x1[i];
                    k0N1k1 += K0[i] * y1[i];
                    k0N2k0 += K0[i] * z1[i];
                }
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < n; j++) {
                        double hi = h[i], hj = h[j], hij = hi * hj;
                        /* A'N2A = N2 - h z1' - z1 h' + k0N2k0 hh' */
                        double n2 = N2[i * n + j] - hi * z1[j] - z1[i] * hj + k0N2k0 * hij;
                        /* A'N1B + B'N1A: A'N1B = -(N1 - h k0'N1) K1 h' = -(y1 - h k0N1k1) h' */
                        n2 += -(y1[i] - hi * k0N1k1) * hj - hi * (y1[j] - hj * k0N1k1);
                        /* B'N0B = k1N0k1 hh' */
                        n2 += k1N0k1 * hij - e->fs / (e->f * e->f) * hij;
                        /* N1: A'N1A + B'N0A + A'N0B + hh'/finf */
                        double n1 = N1[i * n + j] - hi * x1[j] - x1[i] * hj + k0N1k0 * hij;
                        n1 += -(y0[i] - hi * k0N0k1) * hj - hi * (y0[j] - hj * k0N0k1);
                        n1 += hij / e->f;
                        double n0 = N0[i * n + j] - hi * x0[j] - x0[i] * hj + k0N0k0 * hij;
                        N2[i * n + j] = n2;
                        N1[i * n + j] = n1;
                        N0[i * n + j] = n0;
                    }
            }
        }
            /* smoothed moments at t from the prediction (a0, P0t, Pinf = D D') */
        double *sm = smean + t * n, *sc = scov + t * nn;
        for (int i = 0; i < n; i++) {
            double s = a0[i];
            for (int j = 0; j < n; j++) s += P0t[i * n + j] * r0[j];
            sm[i] = s;
        }
        /* V = P - (P N0) P */
        mm(n, P0t, N0, w->tmp);
        mm(n, w->tmp, P0t, sc);
        double xmax = 0.0, vmax = 0.0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j <= i; j++) {
                double x = 0.5 * (sc[i * n + j] + sc[j * n + i]), v = P0t[i * n + j] - x;
                sc[i * n + j] = v;
                sc[j * n + i] = v;
                if (fabs(x) > xmax) xmax = fabs(x);
                if (fabs(v) > vmax) vmax = fabs(v);
            }
        /* the information form: J_t (z_{t:T} about x_t) carried back from the last step where
           the covariance form was accurate, and used where that form cancels (a large prior) and
           at the diffuse steps, where Durbin & Koopman's P_inf terms cancel likewise */
        int use_info = 0;
        if (srif && t >= ndk && xmax <= SRIF_SWITCH * vmax) { /* r0, N0 convert accurately */
            memcpy(Nc, N0, nn * sizeof(double));
            memcpy(rc, r0, n * sizeof(double));
            tc = t;
        }
        if (!info_failed) {
            if (t >= ndk && xmax <= INFO_SWITCH * vmax) {
                /* accurate here: serves, and J restarts from here where needed (carried on from
                   a later step, J with near noise-free entries (1/Dg) would lose |J| |Q| digits) */
                memcpy(Ng, N0, nn * sizeof(double));
                memcpy(Pg, P0t, nn * sizeof(double));
                memcpy(rg, r0, n * sizeof(double));
                tg = t;
                info = 0;
                psrif = 0;
                jcond = 0.0;
            } else if (!info && tg == t + 1 && (tg < T || t < ndk)) {
                if (tg == T) { /* diffuse through the last step: J from nothing */
                    memset(J, 0, nn * sizeof(double));
                    info = 1;
                } else { /* J_{t+1} = N (I - P N)^-1 = (I - N P)^-1 N, then back */
                    for (int i = 0; i < n; i++)
                        for (int j = 0; j < n; j++) {
                            double x = i == j ? 1.0 : 0.0;
                            for (int q = 0; q < n; q++) x -= Ng[i * n + q] * Pg[q * n + j];
                            Ab[i * n + j] = x;
                        }
                    memcpy(J, Ng, nn * sizeof(double));
                    load_F(w, n, mat(&in[I_F], b, tg));
                    info = solve(n, Ab, J) && info_back(w, n, J, mat(&in[I_Q], b, tg), Ab);
                    psrif = info && t >= ndk &&
                            srif_from_dk(n, Ng, rg, pmean + tg * n, Pg, sbuf, Sp);
                    if (psrif)
                        srif_back(n, Sp, mat(&in[I_F], b, tg), mat(&in[I_Q], b, tg),
                                  mat(&in[I_C], b, tg), sbuf);
                    jcond = norm_prod(n, Ng, Pg);
                    double c2 = norm_prod(n, J, mat(&in[I_Q], b, tg));
                    if (c2 > jcond) jcond = c2;
                }
                info_failed = !info;
            }
            if (info) { /* J_t = J + sum h h' / Dg over the step's entries */
                for (int p = 0; p < o; p++) {
                    const double *h = w->Hy + p * n;
                    if (!(w->Dg[p] > 0.0)) {
                        info = 0;
                        info_failed = 1;
                        break;
                    }
                    double g = 1.0 / w->Dg[p];
                    for (int i = 0; i < n; i++)
                        for (int j = 0; j < n; j++) J[i * n + j] += g * h[i] * h[j];
                }
                if (info && t >= ndk) { /* V from the rows Sp, else (I + P J)^-1 P */
                    double hdummy = 0.0;
                    if (psrif) psrif = srif_obs(n, Sp, o, w->Hy, w->y, w->Dg, sbuf, &hdummy);
                    if (psrif) /* k = 0: no diffuse columns (P0t stands in for D) */
                        psrif = srif_smoothed(n, Sp, 0, a0, P0t, P0t, sbuf, x, Vi, 0);
                    if (psrif) {
                        use_info = 1;
                    } else {
                        mm(n, P0t, J, Ab);
                        for (int i = 0; i < n; i++) Ab[i * n + i] += 1.0;
                        memcpy(Vi, P0t, nn * sizeof(double));
                        use_info = solve(n, Ab, Vi);
                        for (int i = 0; i < n && use_info; i++)
                            for (int j = 0; j < i; j++) {
                                double v = 0.5 * (Vi[i * n + j] + Vi[j * n + i]);
                                Vi[i * n + j] = v;
                                Vi[j * n + i] = v;
                            }
                    }
                } else if (info) { /* diffuse step: square-root form, if it is well conditioned */
                    double lcond = 0.0;
                    use_info = info_smoothed_cov(n, kt, P0t, pD + t * nn, J, ibuf, Vi, &lcond) &&
                               lcond <= INFO_COND;
                }
                if (info && !use_info && t >= ndk) {
                    info = 0;
                    info_failed = 1;
                }
            }
        }
        if (t >= ndk && use_info) memcpy(sc, Vi, nn * sizeof(double));
        if (rows_all && srif && t >= nh) { /* V from the rows where the DK form disagrees */
            if (!srif_smoothed(n, Srif, 0, a0, P0t, P0t, sbuf, x, Vi, 0))
                srif = 0;
            else if (!agree(n, sm, sc, x, Vi, near_tol(hmax * qmax)) ||
                     DBL_EPSILON * xmax > near_tol(hmax * qmax) * vmax) {
                /* the rows also where P - P N P cancels beyond their error level (its own,
                   eps |P N P| / |V|: a 2-state model observed whole at R = 1e-10 I was 1.0e-8
                   relative off at every other step, within near_tol of the rows) */
                memcpy(sm, x, n * sizeof(double));
                memcpy(sc, Vi, nn * sizeof(double));
            }
        }
        if (t < ndk) {
            DDt(n, kt, pD + t * nn, Pinf);
            for (int i = 0; i < n; i++) {
                double s = 0.0;
                for (int j = 0; j < n; j++) s += Pinf[i * n + j] * r1[j];
                sm[i] += s;
            }
            /* Y = (Pinf N1) P, U = Pinf N2 Pinf; V -= Y + Y' + U */
            double *Y = w->tmp, *X = w->G;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) {
                    double s = 0.0;
                    for (int q = 0; q < n; q++) s += Pinf[i * n + q] * N1[q * n + j];
                    X[i * n + j] = s;
                }
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) {
                    double s = 0.0;
                    for (int q = 0; q < n; q++) s += X[i * n + q] * P0t[q * n + j];
                    Y[i * n + j] = s;
                }
            /* Pinf N2 Pinf */
            double *U = w->G;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) {
                    double s = 0.0;
                    for (int q = 0; q < n; q++) s += Pinf[i * n + q] * N2[q * n + j];
                    U[i * n + j] = s;
                }
            for (int i = 0; i < n; i++)
                for (int j = 0; j <= i; j++) {
                    double s = 0.0;
                    for (int q = 0; q < n; q++) s += U[i * n + q] * Pinf[q * n + j];
                    double v = sc[i * n + j] - Y[i * n + j] - Y[j * n + i] - s;
                    double big = fabs(Y[i * n + j]) + fabs(Y[j * n + i]) + fabs(s);
                    if (big > xmax) xmax = big;
                    sc[i * n + j] = v;
                    sc[j * n + i] = v;
                }
            vmax = 0.0;
            for (int i = 0; i < nn; i++)
                if (fabs(sc[i]) > vmax) vmax = fabs(sc[i]);
            /* Durbin & Koopman's diffuse terms lose up to 1e-7 relative on some models (diffuse rank
               dropping over several steps with a full P_*; docs/dense.md): the square-root
               information form serves whenever its back steps and its factorization were well
               conditioned (not so with near noise-free observations, where 1/Dg dwarfs Q and
               the P_inf terms are the accurate ones) */
            if (use_info && jcond <= INFO_COND)
                memcpy(sc, Vi, nn * sizeof(double));
            if (srif && !srif_smoothed(n, Srif, kt, a0, P0t, pD + t * nn, sbuf, x, Vi, 0))
                srif = 0;
            /* with a near noise-free entry the square-root rows lose digits like
               eps sqrt(|h|^2 |Q| / Dg), and the diffuse terms are often exact (KFAS's VAR(1)) but
               not always (1e-6 relative off on random 3-state models): those serve where they
               agree with the rows to within the rows' own error */
            if (srif && (!near || !agree(n, sm, sc, x, Vi, near_tol(hmax * qmax)))) {
                memcpy(sm, x, n * sizeof(double));
                memcpy(sc, Vi, nn * sizeof(double));
            }
        }
        if (fin && t < nh) { /* a large prior's head: x_t = a + L u + D v, u, v ~ N(0, I) */
            if (srif && !srif_smoothed(n, Srif, kt, a0, pcov + t * nn, pD + t * nn, sbuf, x, Vi, 1))
                srif = 0;
            if (srif) {
                memcpy(sm, x, n * sizeof(double));
                memcpy(sc, Vi, nn * sizeof(double));
            }
        }
        if (!prec_inverse(w, n, sc, w->tmp, sprec + t * nn)) {
            for (int i = 0; i < nn; i++) sprec[t * nn + i] = NAN;
            (*nbad)++;
        }
        /* to step t - 1 */
        load_F(w, n, mat(&in[I_F], b, t));
        if (info) {
            double c2 = norm_prod(n, J, mat(&in[I_Q], b, t));
            if (c2 > jcond) jcond = c2;
        }
        if (info && !info_back(w, n, J, mat(&in[I_Q], b, t), Ab)) {
            info = 0;
            info_failed = 1;
        }
        if (!info || t <= ndk) psrif = 0;
        if (psrif)
            srif_back(n, Sp, mat(&in[I_F], b, t), mat(&in[I_Q], b, t), mat(&in[I_C], b, t), sbuf);
        if (srif && t > 0 && (t < nh || rows_all))
            srif_back(n, Srif, mat(&in[I_F], b, t), mat(&in[I_Q], b, t), mat(&in[I_C], b, t),
                      sbuf);
        back_vec(w, n, r0);
        back_cov(w, n, N0);
        if (t <= ndk) {
            back_vec(w, n, r1);
            back_cov(w, n, N1);
            back_cov(w, n, N2);
        }
    }
    if (fin) add_factor(n, nh, pcov, pD, pK, w->tmp);
    free(Srif);
    free(r0);
    return nd;
}

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
    Py_ssize_t nd_max = 0, np_max = 0, err = 0, nbad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < B; b++) {
        Py_ssize_t npred = 0;
        Py_ssize_t nd = run_any(&w, in, out, (const double *)pm0 + b * n,
                                   (const double *)pP0 + b * nn, (const double *)pD0 + b * nn, b,
                                   T, kcap, smooth, fins ? (int)fins[b] : fin, &npred, &nbad);
        if (nd < 0) err = 1;
        if (nd > nd_max) nd_max = nd;
        if (npred > np_max) np_max = npred;
    }
    Py_END_ALLOW_THREADS
    free(buf);
    free(el);
    free(ib);
    if (err) return PyErr_NoMemory();
    return Py_BuildValue("nnni", nd_max, np_max, nbad, w.zinf);
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
