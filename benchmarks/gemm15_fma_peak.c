/* FMA peak probe (helper gemm15): one thread, 24 independent zmm FMA chains in registers, and a
 * 6x64 GEMM-like kernel reading L1 (4 vector loads + 6 broadcasts per 24 FMAs).
 * gcc -O2 -march=native benchmarks/gemm15_fma_peak.c -o /tmp/peak && /tmp/peak */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define R(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
float buf[4096] __attribute__((aligned(64)));
int main(){
#define D(i) __m512 a##i=_mm512_set1_ps(1.0f+i*1e-7f);
  R(D)
  for(int i=0;i<4096;i++)buf[i]=0.999f;
  long n=50000000; double t;
  // variant 1: 4 vector loads + 6 broadcasts per 24 FMA (like 6x64 kernel), all L1
  t=now();
  for(long i=0;i<n;i++){ const float* p=buf+((i*64)&2047);
    __m512 b0=_mm512_load_ps(p),b1=_mm512_load_ps(p+16),b2=_mm512_load_ps(p+32),b3=_mm512_load_ps(p+48);
    __m512 x0=_mm512_set1_ps(p[1]),x1=_mm512_set1_ps(p[2]),x2=_mm512_set1_ps(p[3]),x3=_mm512_set1_ps(p[4]),x4=_mm512_set1_ps(p[5]),x5=_mm512_set1_ps(p[6]);
#define F(i) a##i=_mm512_fmadd_ps(x##i##_, b##i##__, a##i);
    a0=_mm512_fmadd_ps(x0,b0,a0);a1=_mm512_fmadd_ps(x0,b1,a1);a2=_mm512_fmadd_ps(x0,b2,a2);a3=_mm512_fmadd_ps(x0,b3,a3);
    a4=_mm512_fmadd_ps(x1,b0,a4);a5=_mm512_fmadd_ps(x1,b1,a5);a6=_mm512_fmadd_ps(x1,b2,a6);a7=_mm512_fmadd_ps(x1,b3,a7);
    a8=_mm512_fmadd_ps(x2,b0,a8);a9=_mm512_fmadd_ps(x2,b1,a9);a10=_mm512_fmadd_ps(x2,b2,a10);a11=_mm512_fmadd_ps(x2,b3,a11);
    a12=_mm512_fmadd_ps(x3,b0,a12);a13=_mm512_fmadd_ps(x3,b1,a13);a14=_mm512_fmadd_ps(x3,b2,a14);a15=_mm512_fmadd_ps(x3,b3,a15);
    a16=_mm512_fmadd_ps(x4,b0,a16);a17=_mm512_fmadd_ps(x4,b1,a17);a18=_mm512_fmadd_ps(x4,b2,a18);a19=_mm512_fmadd_ps(x4,b3,a19);
    a20=_mm512_fmadd_ps(x5,b0,a20);a21=_mm512_fmadd_ps(x5,b1,a21);a22=_mm512_fmadd_ps(x5,b2,a22);a23=_mm512_fmadd_ps(x5,b3,a23);
  }
  t=now()-t;
#define S(i) s+=_mm512_reduce_add_ps(a##i);
  float s=0; R(S)
  printf("6x64 L1 kernel: %.1f GFLOP/s (%g)\n", n*24*32.0/t/1e9, s);
  // variant 2: pure reg, 24 chains
  t=now();
  __m512 b=_mm512_set1_ps(0.999f);
  for(long i=0;i<n;i++){
#define G(i) a##i=_mm512_fmadd_ps(a##i,b,b);
    R(G)
  }
  t=now()-t; s=0; R(S)
  printf("reg: %.1f GFLOP/s (%g)\n", n*24*32.0/t/1e9, s);
}
