// promptlookup: rows [r0, r1) of an F16 matrix (row stride x_stride bytes) against nc F16 columns (the
// attention's K and V against a batch's queries and weights). Each result is ggml_vec_dot_f16's: the
// same SIMD macros, loads, fused multiply-adds, reduction and leftovers, per (row, column), so the
// bits do not depend on the batch; a row's values are loaded once for several columns, and each
// column's values are loaded (converted) once for all the rows, by the same load macro, then reused.
#if defined(GGML_SIMD) && !defined(__ARM_FEATURE_SVE) && !defined(__riscv_v_intrinsic)
#if defined(__AVX512F__)
#define PL_F16_COLS 4
#else
#define PL_F16_COLS 2
#endif
// the longest row (values) whose columns are kept loaded: PL_F16_COLS x 16 KB of stack with AVX-512
#define PL_F16_COLS_KEPT 4096
#endif

#if defined(PL_F16_COLS)
// One row against M columns, M a constant so that the M x GGML_F16_DOT_ARR sums stay in registers (a
// loop over a variable count kept them in memory: twice the time at a head's 128 values). KEPT: the
// columns' vectors were loaded already, yv[c*nv + k] is the k-th vector of column c (k = i /
// GGML_F16_DOT_EPR, nv vectors a column), the value the load macro gives for it; otherwise they are
// loaded here.
template <int M, bool KEPT>
static inline void pl_f16_cols_row(int n, int np, const ggml_fp16_t * GGML_RESTRICT xr,
        const ggml_fp16_t * const * GGML_RESTRICT y, const GGML_F16_DOT_VEC * GGML_RESTRICT yv,
        float * const * GGML_RESTRICT s, int64_t r) {
    const int nv = np / GGML_F16_DOT_EPR;
    GGML_F16_DOT_VEC sum[M][GGML_F16_DOT_ARR];
    for (int c = 0; c < M; ++c) {
        for (int j = 0; j < GGML_F16_DOT_ARR; j++) {
            sum[c][j] = GGML_F16_DOT_VEC_ZERO;
        }
    }
    for (int i = 0; i < np; i += GGML_F16_DOT_STEP) {
        for (int j = 0; j < GGML_F16_DOT_ARR; j++) {
            const GGML_F16_DOT_VEC ax = GGML_F16_DOT_VEC_LOAD(xr + i + j*GGML_F16_DOT_EPR, j);
            for (int c = 0; c < M; ++c) {
                const GGML_F16_DOT_VEC ay = KEPT ? yv[c*nv + i/GGML_F16_DOT_EPR + j]
                                                 : GGML_F16_DOT_VEC_LOAD(y[c] + i + j*GGML_F16_DOT_EPR, j);
                sum[c][j] = GGML_F16_DOT_VEC_FMA(sum[c][j], ax, ay);
            }
        }
    }
    // unrolled, or the compiler keeps sum in memory for this loop's indexing (half the speed at a head's 128)
#pragma GCC unroll 4
    for (int c = 0; c < M; ++c) {
        ggml_float sumf = 0.0;
        GGML_F16_DOT_VEC_REDUCE(sumf, sum[c]);
        for (int i = np; i < n; ++i) {
            sumf += (ggml_float)(GGML_CPU_FP16_TO_FP32(xr[i])*GGML_CPU_FP16_TO_FP32(y[c][i]));
        }
        s[c][r] = sumf;
    }
}

template <bool KEPT>
static void pl_f16_cols_rows(int m, int n, int np, const ggml_fp16_t * GGML_RESTRICT x, size_t x_stride,
        int64_t r0, int64_t r1, const ggml_fp16_t * const * GGML_RESTRICT y,
        const GGML_F16_DOT_VEC * GGML_RESTRICT yv, float * const * GGML_RESTRICT s) {
    for (int64_t r = r0; r < r1; ++r) {
        const ggml_fp16_t * GGML_RESTRICT xr = (const ggml_fp16_t *) ((const char *) x + r * x_stride);
        switch (m) {
#if PL_F16_COLS == 4
            case 4: pl_f16_cols_row<4, KEPT>(n, np, xr, y, yv, s, r); break;
            case 3: pl_f16_cols_row<3, KEPT>(n, np, xr, y, yv, s, r); break;
#endif
            case 2: pl_f16_cols_row<2, KEPT>(n, np, xr, y, yv, s, r); break;
            default: pl_f16_cols_row<1, KEPT>(n, np, xr, y, yv, s, r); break;
        }
    }
}
#endif

void ggml_vec_dot_f16_cols(int n, const ggml_fp16_t * GGML_RESTRICT x, size_t x_stride, int64_t r0, int64_t r1,
        const ggml_fp16_t * const * GGML_RESTRICT y, float * const * GGML_RESTRICT s, int nc) {
#if defined(PL_F16_COLS)
    const int np = (n & ~(GGML_F16_DOT_STEP - 1));
    const bool keep = np <= PL_F16_COLS_KEPT;
    GGML_F16_DOT_VEC yv[PL_F16_COLS * (PL_F16_COLS_KEPT / GGML_F16_DOT_EPR)];
    for (int c0 = 0; c0 < nc; c0 += PL_F16_COLS) {
        const int m = nc - c0 < PL_F16_COLS ? nc - c0 : PL_F16_COLS;
        if (keep) {
            const int nv = np / GGML_F16_DOT_EPR;
            for (int c = 0; c < m; ++c) {
                for (int k = 0; k < nv; ++k) {  // vector k is the kernel's (i, j) = (k / ARR * STEP, k % ARR)
                    yv[c*nv + k] = GGML_F16_DOT_VEC_LOAD(y[c0 + c] + k*GGML_F16_DOT_EPR, k % GGML_F16_DOT_ARR);
                }
            }
            pl_f16_cols_rows<true>(m, n, np, x, x_stride, r0, r1, y + c0, yv, s + c0);
        } else {
            pl_f16_cols_rows<false>(m, n, np, x, x_stride, r0, r1, y + c0, yv, s + c0);
        }
    }
#else
    for (int c = 0; c < nc; ++c) {
        for (int64_t r = r0; r < r1; ++r) {
            ggml_vec_dot_f16(n, &s[c][r], 0, (ggml_fp16_t *) ((const char *) x + r * x_stride), 0,
                             (ggml_fp16_t *) y[c], 0, 1);
        }
    }
#endif
}
