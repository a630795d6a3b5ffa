/* The KLA op's forward over the channels [m0, m1) of a job (see _native_kla.c), included once
 * per dtype with KLA_FT (float or double) and KLA_NAME (the prefix of its functions).
 * The state is kept slot-major ([S, M]) so that every row loop runs over contiguous channels and
 * vectorizes, and the readout's sum over s accumulates into the output row in the order
 * s = 0, 1, ... (no horizontal sums). After an edit, check that the row loops vectorize:
 *     gcc -O3 -fno-math-errno -fno-trapping-math -fPIC -I$(python -c "import sysconfig;
 *     print(sysconfig.get_paths()['include'])") -S kalmanscan/core/_native_kla.c -o - | grep -c
 *     "vdivp[sd].*zmm" */

#define KLA_F(name) KLA_CAT(KLA_NAME, name)

/* One slot s of one token for channels [0, n) (pointers offset to the first channel). */
static inline void KLA_F(_row)(Py_ssize_t n, const KLA_FT *restrict p, const KLA_FT *restrict qf,
                               const KLA_FT *restrict d, const KLA_FT *restrict a,
                               const KLA_FT *restrict Lv, const KLA_FT *restrict v, KLA_FT ks,
                               KLA_FT kks, KLA_FT qs, KLA_FT qqs, KLA_FT *restrict lam,
                               KLA_FT *restrict eta, KLA_FT *restrict y, KLA_FT *restrict yvar) {
    typedef KLA_FT FT;
    for (Py_ssize_t m = 0; m < n; m++) {
        const FT den = p[m] * lam[m] + d[m];
        const FT nl = (lam[m] + qf[m]) / den + Lv[m] * kks;
        const FT ne = a[m] / den * eta[m] + v[m] * Lv[m] * ks;
        lam[m] = nl;
        eta[m] = ne;
        y[m] += qs * ne / nl;
        yvar[m] += qqs / nl;
    }
}

/* [rows, cols] row-major `src` (row stride ss) into `dst` as [cols, rows] (row stride ds), in
 * blocks of 16 columns: the 16 rows of `dst` a block writes stay in the L1 cache. */
static inline void KLA_F(_transpose)(Py_ssize_t rows, Py_ssize_t cols, const KLA_FT *restrict src,
                                     Py_ssize_t ss, KLA_FT *restrict dst, Py_ssize_t ds) {
    for (Py_ssize_t c0 = 0; c0 < cols; c0 += 16) {
        const Py_ssize_t c1 = c0 + 16 < cols ? c0 + 16 : cols;
        for (Py_ssize_t r = 0; r < rows; r++)
            for (Py_ssize_t c = c0; c < c1; c++) dst[c * ds + r] = src[r * ss + c];
    }
}

KS_CLONES static void KLA_NAME(const kla_job *j, Py_ssize_t m0, Py_ssize_t m1) {
    typedef KLA_FT FT;
    const Py_ssize_t L = j->L, M = j->M, S = j->S, n = M * S, w = m1 - m0;
    const FT *pT = (const FT *)j->scratch, *qfT = pT + n, *dT = qfT + n, *aT = dT + n;
    FT *lamT = (FT *)j->scratch + 4 * n, *etaT = lamT + j->B * n;
    for (Py_ssize_t b = 0; b < j->B; b++) {
        FT *lam = (FT *)j->lam + b * n + m0 * S, *eta = (FT *)j->eta + b * n + m0 * S;
        FT *lb = lamT + b * n + m0, *eb = etaT + b * n + m0;
        KLA_F(_transpose)(w, S, lam, S, lb, M);
        KLA_F(_transpose)(w, S, eta, S, eb, M);
        for (Py_ssize_t t = 0; t < L; t++) {
            const Py_ssize_t bt = b * L + t;
            const FT *vt = (const FT *)j->v + bt * M + m0, *Lvt = (const FT *)j->Lv + bt * M + m0;
            const FT *kt = (const FT *)j->k + bt * S, *qt = (const FT *)j->q + bt * S;
            FT *yt = (FT *)j->y + bt * M + m0, *yvt = (FT *)j->yvar + bt * M + m0;
            for (Py_ssize_t m = 0; m < w; m++) yt[m] = yvt[m] = 0;
            for (Py_ssize_t s = 0; s < S; s++) {
                const FT ks = kt[s], qs = qt[s];
                const Py_ssize_t o = s * M + m0;
                KLA_F(_row)(w, pT + o, qfT + o, dT + o, aT + o, Lvt, vt, ks, ks * ks, qs, qs * qs,
                            lb + s * M, eb + s * M, yt, yvt);
            }
            if (j->prec) KLA_F(_transpose)(S, w, lb, M, (FT *)j->prec + bt * n + m0 * S, S);
        }
        KLA_F(_transpose)(S, w, lb, M, lam, S);
        KLA_F(_transpose)(S, w, eb, M, eta, S);
    }
}

/* The per-lane coefficients, slot-major: p, qf = [a*a == 0], d = qf ? p : a*a, a1 = a (1 - qf). */
static void KLA_F(_coeffs)(const kla_job *j) {
    typedef KLA_FT FT;
    const Py_ssize_t M = j->M, S = j->S, n = M * S;
    const FT *a = (const FT *)j->decay, *p = (const FT *)j->process_var;
    FT *pT = (FT *)j->scratch, *qfT = pT + n, *dT = qfT + n, *aT = dT + n;
    for (Py_ssize_t m = 0; m < M; m++)
        for (Py_ssize_t s = 0; s < S; s++) {
            const Py_ssize_t i = m * S + s, o = s * M + m;
            const FT a2 = a[i] * a[i], qf = a2 == 0 ? (FT)1 : (FT)0;
            pT[o] = p[i];
            qfT[o] = qf;
            dT[o] = a2 == 0 ? p[i] : a2;
            aT[o] = a[i] * ((FT)1 - qf);
        }
}

#undef KLA_F
