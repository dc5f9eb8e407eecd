#if defined(__AVX2__)
// promptlookup: the repacked Q4_K gemv (ggml_gemv_q4_K_8x8_q8_K, patched to multiply-add once per 64
// weights) for nr <= 16 token rows in ONE pass over the weights. Upstream runs the gemv once per row
// (widths 1-3, and what a width leaves over 4), so a verify of 3 tokens reads every weight 3 times and
// costs nearly 3 decodes. Here each group of 8 interleaved weight rows is loaded and unpacked once per
// 64 weights and then multiplied with every token row. For each token row the float operations are
// exactly the patched gemv's, in the same order (the integer sums are exact whatever the order), so
// every result is bit-identical to a one-token decode of that row. s: row y of the result at
// s + y * bs; vy: nr consecutive rows of block_q8_K (quantize_row_q8_K, as for the gemv).
void ggml_gemv_q4_K_8x8_q8_K_rows(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx,
                                  const void * GGML_RESTRICT vy, int nr, int nc) {
    static const uint32_t kmask1 = 0x3f3f3f3f;
    static const uint32_t kmask2 = 0x0f0f0f0f;
    static const uint32_t kmask3 = 0x03030303;
    const int nb = n / QK_K;

    assert(n % QK_K == 0);
    assert(nc % 8 == 0);
    assert(nr >= 1 && nr <= 16);

    const __m128i deltamask = _mm_set_epi8(15, 14, 7, 6, 13, 12, 5, 4, 11, 10, 3, 2, 9, 8, 1, 0);
    const __m128i scalemask = _mm_set_epi8(7, 7, 3, 3, 6, 6, 2, 2, 5, 5, 1, 1, 4, 4, 0, 0);
    const __m256i finalpermutemask = _mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0);
    const __m256i m4b = _mm256_set1_epi8(0x0F);

    const block_q4_Kx8 * b_ptr_start = (const block_q4_Kx8 *) vx;
    const block_q8_K * a_ptr_start = (const block_q8_K *) vy;

    __m256 acc_row[16];
    __m256 acc_min_rows[16];
    __m256i q8s[16];

    for (int64_t x = 0; x < nc / 8; x++) {
        const block_q4_Kx8 * b_ptr = b_ptr_start + (x * nb);
        for (int y = 0; y < nr; y++) {
            acc_row[y] = _mm256_setzero_ps();
            acc_min_rows[y] = _mm256_setzero_ps();
        }
        for (int64_t b = 0; b < nb; b++) {
            const __m256 col_scale_f32 = GGML_F32Cx8_REARRANGE_LOAD(b_ptr[b].d, deltamask);
            const __m256 col_dmin_f32 = GGML_F32Cx8_LOAD(b_ptr[b].dmin);
            for (int y = 0; y < nr; y++) {
                const block_q8_K * a = a_ptr_start + (int64_t) y * nb + b;
                const __m256i q8sums = _mm256_loadu_si256((const __m256i *) (a->bsums));
                __m256i t = _mm256_castsi128_si256(_mm_hadd_epi16(_mm256_castsi256_si128(q8sums),
                                                                  _mm256_extracti128_si256(q8sums, 1)));
                q8s[y] = _mm256_permute2f128_si256(t, t, 0);
            }
            for (int sb = 0; sb < QK_K / 64; sb++) {
                const uint8_t * q = b_ptr[b].qs + sb * 256;
                const __m256i raw_0123_0 = _mm256_loadu_si256((const __m256i *) (q));
                const __m256i raw_4567_0 = _mm256_loadu_si256((const __m256i *) (q + 32));
                const __m256i raw_0123_1 = _mm256_loadu_si256((const __m256i *) (q + 64));
                const __m256i raw_4567_1 = _mm256_loadu_si256((const __m256i *) (q + 96));
                const __m256i raw_0123_2 = _mm256_loadu_si256((const __m256i *) (q + 128));
                const __m256i raw_4567_2 = _mm256_loadu_si256((const __m256i *) (q + 160));
                const __m256i raw_0123_3 = _mm256_loadu_si256((const __m256i *) (q + 192));
                const __m256i raw_4567_3 = _mm256_loadu_si256((const __m256i *) (q + 224));

                // the low and high nibbles (first and second sub block), then the gemv's two
                // blends of each pair: the byte vectors its maddubs take, made once for all rows
                __m256i w[16];
                {
                    const __m256i lo[8] = {
                        _mm256_and_si256(raw_0123_0, m4b), _mm256_and_si256(raw_4567_0, m4b),
                        _mm256_and_si256(raw_0123_1, m4b), _mm256_and_si256(raw_4567_1, m4b),
                        _mm256_and_si256(raw_0123_2, m4b), _mm256_and_si256(raw_4567_2, m4b),
                        _mm256_and_si256(raw_0123_3, m4b), _mm256_and_si256(raw_4567_3, m4b)};
                    const __m256i hi[8] = {
                        _mm256_and_si256(_mm256_srli_epi16(raw_0123_0, 4), m4b),
                        _mm256_and_si256(_mm256_srli_epi16(raw_4567_0, 4), m4b),
                        _mm256_and_si256(_mm256_srli_epi16(raw_0123_1, 4), m4b),
                        _mm256_and_si256(_mm256_srli_epi16(raw_4567_1, 4), m4b),
                        _mm256_and_si256(_mm256_srli_epi16(raw_0123_2, 4), m4b),
                        _mm256_and_si256(_mm256_srli_epi16(raw_4567_2, 4), m4b),
                        _mm256_and_si256(_mm256_srli_epi16(raw_0123_3, 4), m4b),
                        _mm256_and_si256(_mm256_srli_epi16(raw_4567_3, 4), m4b)};
                    for (int j = 0; j < 4; j++) {
                        w[2 * j] = _mm256_blend_epi32(lo[2 * j], _mm256_shuffle_epi32(lo[2 * j + 1], 177), 170);
                        w[2 * j + 1] = _mm256_blend_epi32(_mm256_shuffle_epi32(lo[2 * j], 177), lo[2 * j + 1], 170);
                        w[8 + 2 * j] = _mm256_blend_epi32(hi[2 * j], _mm256_shuffle_epi32(hi[2 * j + 1], 177), 170);
                        w[8 + 2 * j + 1] = _mm256_blend_epi32(_mm256_shuffle_epi32(hi[2 * j], 177), hi[2 * j + 1], 170);
                    }
                }

                uint32_t utmp_0[4], utmp_1[4];
                memcpy(utmp_0, b_ptr[b].scales + 24 * sb, 12);
                utmp_0[3] = ((utmp_0[2] >> 4) & kmask2) | (((utmp_0[1] >> 6) & kmask3) << 4);
                const uint32_t uaux_0 = utmp_0[1] & kmask1;
                utmp_0[1] = (utmp_0[2] & kmask2) | (((utmp_0[0] >> 6) & kmask3) << 4);
                utmp_0[2] = uaux_0;
                utmp_0[0] &= kmask1;

                memcpy(utmp_1, b_ptr[b].scales + 12 + sb * 24, 12);
                utmp_1[3] = ((utmp_1[2] >> 4) & kmask2) | (((utmp_1[1] >> 6) & kmask3) << 4);
                const uint32_t uaux_1 = utmp_1[1] & kmask1;
                utmp_1[1] = (utmp_1[2] & kmask2) | (((utmp_1[0] >> 6) & kmask3) << 4);
                utmp_1[2] = uaux_1;
                utmp_1[0] &= kmask1;

                const __m128i mins_and_scales_0 = _mm_set_epi32(utmp_0[3], utmp_0[2], utmp_0[1], utmp_0[0]);
                const __m256i scales_0 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(mins_and_scales_0, scalemask));
                const __m128i mins_and_scales_1 = _mm_set_epi32(utmp_1[3], utmp_1[2], utmp_1[1], utmp_1[0]);
                const __m256i scales_1 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(mins_and_scales_1, scalemask));
                const __m256i mins_01 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_shuffle_epi32(mins_and_scales_0, 78),
                                                                               _mm_shuffle_epi32(mins_and_scales_1, 78)));

                for (int y = 0; y < nr; y++) {
                    const block_q8_K * a = a_ptr_start + (int64_t) y * nb + b;
                    const __m256 row_scale_f32 = _mm256_set1_ps(a->d);
                    __m256i lhs_00 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) (a->qs + sb * 64)));
                    __m256i lhs_01 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) (a->qs + 16 + sb * 64)));
                    __m256i lhs_10 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) (a->qs + 32 + sb * 64)));
                    __m256i lhs_11 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *) (a->qs + 48 + sb * 64)));
                    lhs_00 = _mm256_permute2f128_si256(lhs_00, lhs_00, 0);
                    lhs_01 = _mm256_permute2f128_si256(lhs_01, lhs_01, 0);
                    lhs_10 = _mm256_permute2f128_si256(lhs_10, lhs_10, 0);
                    lhs_11 = _mm256_permute2f128_si256(lhs_11, lhs_11, 0);

                    __m256i iacc_0 = _mm256_setzero_si256();
                    __m256i iacc_1 = _mm256_setzero_si256();
                    iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(w[0], _mm256_shuffle_epi32(lhs_00, 0)));
                    iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(w[1], _mm256_shuffle_epi32(lhs_00, 85)));
                    iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(w[2], _mm256_shuffle_epi32(lhs_00, 170)));
                    iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(w[3], _mm256_shuffle_epi32(lhs_00, 255)));
                    iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(w[4], _mm256_shuffle_epi32(lhs_01, 0)));
                    iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(w[5], _mm256_shuffle_epi32(lhs_01, 85)));
                    iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(w[6], _mm256_shuffle_epi32(lhs_01, 170)));
                    iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(w[7], _mm256_shuffle_epi32(lhs_01, 255)));
                    iacc_0 = _mm256_madd_epi16(iacc_0, scales_0);

                    iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(w[8], _mm256_shuffle_epi32(lhs_10, 0)));
                    iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(w[9], _mm256_shuffle_epi32(lhs_10, 85)));
                    iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(w[10], _mm256_shuffle_epi32(lhs_10, 170)));
                    iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(w[11], _mm256_shuffle_epi32(lhs_10, 255)));
                    iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(w[12], _mm256_shuffle_epi32(lhs_11, 0)));
                    iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(w[13], _mm256_shuffle_epi32(lhs_11, 85)));
                    iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(w[14], _mm256_shuffle_epi32(lhs_11, 170)));
                    iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(w[15], _mm256_shuffle_epi32(lhs_11, 255)));
                    iacc_1 = _mm256_madd_epi16(iacc_1, scales_1);

                    const __m256i iacc_sb = _mm256_add_epi32(iacc_0, iacc_1);
                    const __m256i q8s_sb = _mm256_shuffle_epi32(q8s[y], 0);
                    const __m256i iacc_min_sb = _mm256_madd_epi16(q8s_sb, mins_01);
                    q8s[y] = _mm256_bsrli_epi128(q8s[y], 4);

                    // the patched gemv's float steps, per 64 weights, in its order
                    acc_row[y] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_sb), _mm256_mul_ps(col_scale_f32, row_scale_f32),
                                                 acc_row[y]);
                    acc_min_rows[y] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_min_sb),
                                                      _mm256_mul_ps(col_dmin_f32, row_scale_f32), acc_min_rows[y]);
                }
            }
        }
        for (int y = 0; y < nr; y++) {
            const __m256 r = _mm256_permutevar8x32_ps(acc_row[y], finalpermutemask);
            _mm256_storeu_ps(s + (size_t) y * bs + x * 8, _mm256_sub_ps(r, acc_min_rows[y]));
        }
    }
}
#endif
