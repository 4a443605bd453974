"""What every C kernel of this package starts with, and the flags it is compiled with.

``PRELUDE``: vectors of 16 floats (GCC's vector extension: one AVX-512 register, or
two or four narrower ones on other CPUs), loads and stores at any alignment, a lane-wise
select and a broadcast. ``FLAGS``: for this CPU, with AVX-512's 16 lanes where it has
them (GCC prefers 8 by default), OpenMP.
"""

from __future__ import annotations

__all__ = ["PRELUDE", "FLAGS"]

FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-Wno-psabi", "-fopenmp")

PRELUDE = r"""
#include <math.h>
#include <omp.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define VL 16 /* floats in a vector */
typedef float vf __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4)));
typedef int vi __attribute__((vector_size(64)));
static inline vf ld(const float *p) { return *(const vfu *)p; }
static inline void st(float *p, vf v) { *(vfu *)p = v; }
static inline vf bc(float s) { return (vf){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }
static inline vf sel(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
"""
