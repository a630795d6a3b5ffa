/* _native_dense.c's pass over one series: the precision's screen (series_screen) and the filter
 * and smoother over all its steps (run_series). Included once by _native_dense.c (one
 * translation unit). */
#ifndef KS_NATIVE_DENSE_SERIES_H
#define KS_NATIVE_DENSE_SERIES_H

/* One series: filter (and smoother). Returns the number of leading steps with a diffuse filtered
 * state (T + 1 if some direction is never resolved), or -1 on allocation failure. fin: D0 is the
 * factor of a large proper prior (P0 = 0 then), not diffuse directions: the finite head
 * (_native_dense.c's comment). */
/* Whether the precision's screen runs for series b (the gate of kalmanscan/dense/singular.py):
 * F or Q varying in time; a direction F' and Q both map to 0 (null(F F' + Q): with no direction
 * known before and no exact entry, the directions known at a step are null(Q) and those F' maps
 * into the ones known a step before, empty at every step unless this is not); a singular proper
 * prior (w->P, plus w->D's k columns for a large one's factor); a diffuse prior's singular finite
 * part (w->P plus its diffuse directions D D' at the scale of P's largest entry: a direction of
 * the finite part known exactly beside the diffuse ones). An exact entry turns it on later
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
    DDt(n, k, w->D, M);
    double s = 1.0; /* a diffuse prior: its directions at the finite part's scale (largest entry) */
    if (!fin && k > 0) {
        double top = 0.0;
        for (int i = 0; i < n * n; i++) top = fabs(w->P[i]) > top ? fabs(w->P[i]) : top;
        if (top > 0.0) s = top;
    }
    for (int i = 0; i < n * n; i++) M[i] = s * M[i] + w->P[i];
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
    w->faded = 0;
    Py_ssize_t nd = 0, np_ = 0, nfs = 0; /* nfs: steps whose entries ran on the factor of P */
    int forgot = 0; /* a diffuse direction of a step's filtered state that F then maps to 0 */
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
            if (!fin) {
                const int k_prev = k;
                k = factor_basis(w, n, k);
                forgot |= t > 0 && k < k_prev;
            }
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
    /* never resolved (left at the end, or forgotten by F): the scan's smoother keeps such a
       direction diffuse; Durbin & Koopman's here would give it a finite variance */
    if ((k > 0 || (forgot && smooth > 0) || w->faded) && !fin) nd = T + 1;
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
    /* the smoothed covariance V at tg is singular (the screen's test): no J to convert there */
    int tg_sing = 0;
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
                /* the rows from r0, N0 at tc where that conversion is well conditioned: it
                   solves with I - N P (= P^-1 V), whose condition number reached 5e11 on an
                   integrated trend (smoothed covariances of condition 1.5e12): its rows put the
                   diffuse steps' smoothed means 20 posterior sd off, 55 times the truth, where
                   the rows from the end are within 4e-10 sd (tests/test_dense_native_diffuse.py).
                   Otherwise, or where I - N P is singular, the rows run from the end */
                double ccond = 0.0;
                if (srif_from_dk(n, Nc, rc, pmean + tc * n, pcov + tc * nn, sbuf, Srif, &ccond) &&
                    ccond <= SRIF_COND) {
                    srif_back(n, Srif, mat(&in[I_F], b, tc), mat(&in[I_Q], b, tc),
                              mat(&in[I_C], b, tc), sbuf);
                    t1 = tc - 1;
                } else {
                    memset(Srif, 0, (size_t)n * (n + 1) * sizeof(double));
                }
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
            } else if (!info && tg == t + 1 && !tg_sing && (tg < T || t < ndk)) {
                /* J_{t+1} = V^-1 - P^-1 is infinite along a direction V = P - P N P does not
                   have (known exactly at tg: a noise-free entry there, or one reached through
                   Q's null space); I - N P = P^-1 V is then singular, and its solve gives
                   rounding, 1/eps-sized along an arbitrary direction, which the O(1) factors
                   of jcond do not see: the smoothed variance at a diffuse step before a
                   noise-free entry was 14 % off, a large prior's head's 3.5e-2 relative at
                   1e4 I and 2e2 at 1e6 I (tests/test_dense_native_diffuse.py). No information form starts at such a tg:
                   Durbin & Koopman's form serves until the next step back where it is accurate,
                   as where a noise-free entry meets the carried J (Dg = 0 below) */
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
                            srif_from_dk(n, Ng, rg, pmean + tg * n, Pg, sbuf, Sp, NULL);
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
        {
            /* prec_inverse, with the screen's test also kept at tg (whatever w->screen) */
            double *sp = sprec + t * nn;
            const int pok = spd_inverse(n, sc, w->tmp, sp);
            const int sing = !pok || ((t == tg || w->screen) && near_singular(n, sc, sp));
            if (t == tg) tg_sing = sing;
            if (!pok || (w->screen && sing)) {
                for (int i = 0; i < nn; i++) sp[i] = NAN;
                (*nbad)++;
            }
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

#endif /* KS_NATIVE_DENSE_SERIES_H */
