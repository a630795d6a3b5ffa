/* _native_dense.c's workspace (ws_t) and small dense matrix operations: the step's sparse F and
 * its products, the predicted and backward covariances, products, solves, SPD inverses by
 * Cholesky and the precision's screen, singular values and the pdet term. Included once by
 * _native_dense.c (one translation unit). */
#ifndef KS_NATIVE_DENSE_LINALG_H
#define KS_NATIVE_DENSE_LINALG_H

typedef struct {
    int n, d, zinf;
    int screen; /* a direction may be known exactly: the precision's screen runs (prec_inverse) */
    int faded;  /* the series' diffuse factor has faded (factor_basis): the torch scan serves it */
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

#endif /* KS_NATIVE_DENSE_LINALG_H */
