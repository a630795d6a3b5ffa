/* _native_dense.c's square-root, information and factor forms: the backward square-root
 * information filter (srif_*) and the information-form smoothed covariance of the smoother, a
 * step's near noise-free entries on the factor of P (near_step, to_factor, fold_factor,
 * observed_whole) and the helpers that compare and complete their results. Included once by
 * _native_dense.c (one translation unit). */
#ifndef KS_NATIVE_DENSE_SQRT_H
#define KS_NATIVE_DENSE_SQRT_H

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
 * diffuse steps only. 0 if I - N P is singular. *cond (unless NULL): cond_inf(I - N P) =
 * |I - N P| |I + J P|, what the solve may amplify the rounding of N and P by (5e11 on an
 * integrated trend whose smoothed covariances have condition 1.5e12: the caller then runs the
 * rows from the end). buf: 3 n^2 + 2 n doubles. */
static KS_INLINE int srif_from_dk(int n, const double *N, const double *r, const double *a,
                                      const double *P, double *buf, double *S, double *cond) {
    const int nn = n * n, c = n + 1;
    double *A = buf, *X = A + nn, *W = X + nn, *jv = W + nn, *u = jv + n;
    double na = 0.0, nb = 0.0;
    for (int i = 0; i < n; i++) {
        double sa = 0.0;
        for (int j = 0; j < n; j++) {
            double s = i == j ? 1.0 : 0.0;
            for (int q = 0; q < n; q++) s -= N[i * n + q] * P[q * n + j];
            A[i * n + j] = s;
            sa += fabs(s);
        }
        na = fmax(na, sa);
    }
    /* X = (I - N P)^-1 [N | r]: the vector rides in the solve's B as column 0 of a second pass */
    memcpy(X, N, nn * sizeof(double));
    double *A2 = W; /* W is free until the factorization */
    memcpy(A2, A, nn * sizeof(double));
    if (!solve(n, A, X)) return 0;
    for (int i = 0; i < n; i++) { /* |(I - N P)^-1| = |I + J P| (J = X) */
        double sb = 0.0;
        for (int j = 0; j < n; j++) {
            double s = i == j ? 1.0 : 0.0;
            for (int q = 0; q < n; q++) s += X[i * n + q] * P[q * n + j];
            sb += fabs(s);
        }
        nb = fmax(nb, sb);
    }
    if (cond) *cond = na * nb;
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

#endif /* KS_NATIVE_DENSE_SQRT_H */
