/* The build prelude of the native extensions (core/_native.c, core/_native_kla.c,
 * dense/_native_dense.c): Python.h and the C headers they use, pthreads where there are any,
 * one copy of the kernels per x86-64 level, and no fused multiply-adds where the includer asks
 * (KS_NO_FMA defined before the include).
 */
#ifndef KS_NATIVE_COMMON_H
#define KS_NATIVE_COMMON_H

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
#define KS_MAX_THREADS 64

/* No fused multiply-adds: a lane's arithmetic must not depend on whether it lands in a vector
 * body, a loop's scalar remainder or the lane-by-lane form, and each lane rounds as the torch
 * reference does (separate operations). */
#ifdef KS_NO_FMA
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif
#endif

/* Build one copy of the marked kernels per x86-64 level and pick at load time (GNU ifunc). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    (__GNUC__ >= 11)
#define KS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KS_CLONES
#endif
#if defined(__GNUC__)
#define KS_INLINE inline __attribute__((always_inline))
#define KS_NOINLINE __attribute__((noinline))
#else
#define KS_INLINE inline
#define KS_NOINLINE
#endif

#endif /* KS_NATIVE_COMMON_H */
