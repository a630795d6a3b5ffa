/* _native_dense.c's padded vector forms (GCC vector extensions) for 4 < n <= KS_VMAX: the
 * products and inverses of the 13-state trend + seasonal model, with an AVX-512 form of the SPD
 * inverse where the compiler has it. Included once by _native_dense.c (one translation unit). */
#ifndef KS_NATIVE_DENSE_VEC_H
#define KS_NATIVE_DENSE_VEC_H

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

#endif /* KS_NATIVE_DENSE_VEC_H */
