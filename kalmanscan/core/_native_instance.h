/* One instantiation of the native kernel (_native_kernel.h) and its adjoint (_native_adjoint.h)
 * for the dtype the includer describes: KS_FT, KS_FT_MIN, KS_FT_MAX, KS_FT_TRUE_MIN, KS_SAFE_MIN,
 * KS_SAFE_MAX, KS_UINT, KS_EXP_MASK, KS_EXP_TWICE_BIAS and KS_NAME (see _native.c). The description is
 * undefined afterwards, ready for the next dtype. */
#include "_native_kernel.h"
#include "_native_adjoint.h"
#undef KS_FT
#undef KS_FT_MIN
#undef KS_FT_MAX
#undef KS_FT_TRUE_MIN
#undef KS_SAFE_MIN
#undef KS_SAFE_MAX
#undef KS_UINT
#undef KS_EXP_MASK
#undef KS_EXP_TWICE_BIAS
#undef KS_NAME
