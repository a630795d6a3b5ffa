/* _native_dense.c's filter update of one step: its observed entries gathered and decorrelated
 * (gather), processed one scalar at a time with the exact diffuse update and the diffuse factor's
 * Householder steps (update), and a diffuse state's filtered outputs (diffuse_outputs). Included
 * once by _native_dense.c (one translation unit). */
#ifndef KS_NATIVE_DENSE_UPDATE_H
#define KS_NATIVE_DENSE_UPDATE_H

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
        /* a real column (not its product's rounding) nearly in the others' range: a power of F
           aligns two directions it mixes (eigenvalues 1.0024 and 0.5876: the second's share
           below FADED_RES after 21 steps, below the rounding after about 68), though both stay
           diffuse; this factor cannot hold the second one's scale (the series goes to the torch
           scan, whose diffuse head carries a graded factor: kalmanscan/dense/graded.py). Taken
           on the way down, above DIFFUSE_TOL: at the rounding it is a singular F's dependent
           column, which is dropped */
        if (picked > 0 && res > DIFFUSE_TOL && res < FADED_RES) w->faded = 1;
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

/* Pd = U U' with U an orthonormal basis of range(D[:, :k]) (modified Gram-Schmidt, twice; a
 * column that the earlier ones leave exactly 0 stays 0); D row-major n x n, U and Pd n x n.
 * Returns the rank (the nonzero columns of U). */
static KS_INLINE int range_projector(int n, int k, const double *D, double *U, double *Pd) {
    int r = 0;
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
        r += s > 0.0;
        s = s > 0.0 ? 1.0 / sqrt(s) : 0.0;
        for (int i = 0; i < n; i++) U[i * n + j] *= s;
    }
    DDt(n, k, U, Pd);
    return r;
}

/* Z (n x m, row stride n): an orthonormal basis of the complement of range(U[:, :k]) (U from
 * range_projector, m = n - its rank), completed from the identity's columns: their residues
 * C = I - Pd (Pd = U U'), the largest left taken each time, orthogonalized once more against U
 * and the earlier columns of Z and normalized, then projected out of the rest (Gram-Schmidt,
 * twice). The largest residue has norm at least sqrt(1 / n) in exact arithmetic. C (n x n) is
 * overwritten, used (n) scratch. Returns 0 where a residue vanished (a rank miscounted). */
static KS_INLINE int complement_basis(int n, int k, int m, const double *U, const double *Pd,
                                      double *C, double *Z, double *used) {
    for (int i = 0; i < n; i++) {
        used[i] = 0.0;
        for (int j = 0; j < n; j++) C[i * n + j] = (i == j ? 1.0 : 0.0) - Pd[i * n + j];
    }
    for (int p = 0; p < m; p++) {
        int c = -1;
        double best = -1.0;
        for (int j = 0; j < n; j++) {
            if (used[j] != 0.0) continue;
            double s = 0.0;
            for (int i = 0; i < n; i++) s += C[i * n + j] * C[i * n + j];
            if (s > best) {
                best = s;
                c = j;
            }
        }
        if (c < 0) return 0;
        used[c] = 1.0;
        for (int i = 0; i < n; i++) Z[i * n + p] = C[i * n + c];
        for (int q = 0; q < k + p; q++) { /* the second pass: against U, then Z so far */
            const double *V = q < k ? U + q : Z + (q - k);
            double s = 0.0;
            for (int i = 0; i < n; i++) s += V[i * n] * Z[i * n + p];
            for (int i = 0; i < n; i++) Z[i * n + p] -= s * V[i * n];
        }
        double s = 0.0;
        for (int i = 0; i < n; i++) s += Z[i * n + p] * Z[i * n + p];
        if (!(s > 0.0)) return 0;
        s = 1.0 / sqrt(s);
        for (int i = 0; i < n; i++) Z[i * n + p] *= s;
        for (int j = 0; j < n; j++) {
            if (used[j] != 0.0) continue;
            double t = 0.0;
            for (int i = 0; i < n; i++) t += Z[i * n + p] * C[i * n + j];
            for (int i = 0; i < n; i++) C[i * n + j] -= t * Z[i * n + p];
        }
    }
    return 1;
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
 * with +inf on the diagonal of a coordinate that range reaches (the projector Pd above 64 eps
 * there), between two such coordinates the sign of D D' where its correlation exceeds 1e-11
 * (kalmanscan.dense.parallel.cov_with_inf: two diffuse directions that F mixes are correlated,
 * which Pd = I does not show), the finite part elsewhere; and the limit precision
 * Z (Z' P Z)^-1 Z', Z an orthonormal basis of the complement of range(D) (n - r columns, r the
 * rank of range_projector's U; complement_basis), as kalmanscan.dense.parallel.precision_of:
 * exactly 0 along the diffuse directions, all 0 where every direction is diffuse (r = n). It
 * was Pk (Pk P Pk + tau Pd)^-1 Pk, Pk = I - Pd, whose eps entries along the diffuse directions
 * the inverse of a block that is all rounding turned into O(1) where every direction is diffuse
 * and the limit is 0: up to 0.45 of the series' largest precision entry
 * (tests/test_native_dense_diffuse_precision.py). Z' P Z is inverted as the n x n block
 * diagonal [[Z' P Z, 0], [0, tau I]], tau its largest diagonal entry (any tau > 0 gives the
 * same limit; a unit one beside a P of scale v cost |log10 v| digits), so that prec_inverse's
 * screen sees the largest diagonal entries of the matrix and its inverse that it saw before.
 * 0 if not invertible. */
static KS_INLINE int diffuse_outputs(ws_t *w, int n, int k, const double *P, double *cov, double *prec) {
    double *U = w->G, *Pd = w->Lr, *Z = w->xc, *M = w->tmp2x, *inv = w->xx, *W = w->tmp;
    const int m = n - range_projector(n, k, w->D, U, Pd);
    const double tol = 64.0 * 2.220446049250313e-16;
    double *DD = w->tmp;
    DDt(n, k, w->D, DD);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int on = Pd[i * n + i] > tol && Pd[j * n + j] > tol;
            double r = sqrt(fmax(DD[i * n + i], 0.0)) * sqrt(fmax(DD[j * n + j], 0.0));
            int big = on && (i == j || fabs(DD[i * n + j]) > 1e-11 * r);
            cov[i * n + j] = big ? copysign(INFINITY, i == j ? 1.0 : DD[i * n + j]) : P[i * n + j];
        }
    if (m <= 0) { /* every direction diffuse: the limit precision is 0 */
        for (int i = 0; i < n * n; i++) prec[i] = 0.0;
        return 1;
    }
    if (!complement_basis(n, k, m, U, Pd, M, Z, w->xu)) return 0;
    /* M = [[Z' P Z, 0], [0, tau I]] (n x n), W = P Z (n x m, row stride n) */
    for (int i = 0; i < n; i++)
        for (int b = 0; b < m; b++) {
            double s = 0.0;
            for (int q = 0; q < n; q++) s += P[i * n + q] * Z[q * n + b];
            W[i * n + b] = s;
        }
    double tau = 0.0;
    for (int a = 0; a < n; a++)
        for (int b = 0; b <= a; b++) {
            double s = 0.0;
            if (a < m) {
                for (int i = 0; i < n; i++)
                    s += 0.5 * (Z[i * n + a] * W[i * n + b] + Z[i * n + b] * W[i * n + a]);
                if (a == b) tau = fmax(tau, s);
            }
            M[a * n + b] = s;
            M[b * n + a] = s;
        }
    if (!(tau > 0.0) || !isfinite(tau)) tau = 1.0;
    for (int a = m; a < n; a++) M[a * n + a] = tau;
    if (!prec_inverse(w, n, M, w->xl, inv)) return 0;
    /* prec = Z inv[:m, :m] Z' (W = Z inv first), symmetrized */
    for (int i = 0; i < n; i++)
        for (int b = 0; b < m; b++) {
            double s = 0.0;
            for (int a = 0; a < m; a++) s += Z[i * n + a] * inv[a * n + b];
            W[i * n + b] = s;
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0.0;
            for (int b = 0; b < m; b++)
                s += 0.5 * (W[i * n + b] * Z[j * n + b] + W[j * n + b] * Z[i * n + b]);
            prec[i * n + j] = s;
            prec[j * n + i] = s;
        }
    return 1;
}

#endif /* KS_NATIVE_DENSE_UPDATE_H */
