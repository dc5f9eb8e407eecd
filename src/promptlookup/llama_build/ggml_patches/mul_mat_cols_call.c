#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))
    // promptlookup: every row of the chunk against a block of columns at once (ggml_mul_mat_cols): the
    // same result for every (row, column) as the loop below, with what the columns share done once.
    // Columns that broadcast over other matrices of src0 (attention: a K or V head for several query
    // heads) go in runs that share one matrix.
    if ((type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1 ||
         type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q3_K || type == GGML_TYPE_Q4_K ||
         type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K || type == GGML_TYPE_F16) && num_rows_per_vec_dot == 1) {
        const void * cols[16];
        float * outs[16];
        const char * mats[16];
        int64_t iir1 = ir1_start;
        for (; iir1 < ir1_end; iir1 += blck_1) {
            const int nc = (int) (MIN(iir1 + blck_1, ir1_end) - iir1);
            for (int c = 0; c < nc; ++c) {
                const int64_t ir1 = iir1 + c;
                const int64_t i13 = (ir1 / (ne12 * ne1));
                const int64_t i12 = (ir1 - i13 * ne12 * ne1) / ne1;
                const int64_t i11 = (ir1 - i13 * ne12 * ne1 - i12 * ne1);
                cols[c] = (const char*)wdata +
                    (src1_cont || src1->type != vec_dot_type
                        ? (i11 + i12 * ne11 + i13 * ne12 * ne11) * row_size
                        : (i11 * nb11 + i12 * nb12 + i13 * nb13));
                outs[c] = (float*)((char*)dst->data + (i11 * nb1 + i12 * nb2 + i13 * nb3));
                mats[c] = (const char*)src0->data + (i12 / r2) * nb02 + (i13 / r3) * nb03;
            }
            int done = 1;
            for (int c0 = 0, c1; done && c0 < nc; c0 = c1) {
                for (c1 = c0 + 1; c1 < nc && mats[c1] == mats[c0]; ++c1) {}
                done = ggml_mul_mat_cols(type, (int) ne00, mats[c0], nb01, ir0_start, ir0_end, cols + c0, outs + c0,
                                         c1 - c0);
            }
            if (!done) {
                break;  // not for this matrix (the check is the same for every run: the first one fails): below
            }
        }
        if (iir1 >= ir1_end) {
            return;
        }
    }
#endif
