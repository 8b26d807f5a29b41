/* Force-included into every C file of the CPython build (CPPFLAGS=-include ...).
 *
 * glibc 2.29 gave exp/exp2/log/log2/pow new symbol versions (faster code, same results
 * for finite inputs). Code compiled against glibc >= 2.29 binds to the new versions, so
 * the math and _statistics modules would need GLIBC_2.29 at run time although the old
 * versions are still exported by every later glibc. Binding to the old versions keeps the
 * bundle's glibc floor at 2.28, the floor the onnxruntime wheel sets anyway.
 */
#if defined(__x86_64__)
#define DECIDE_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define DECIDE_GLIBC_BASE "GLIBC_2.17"
#endif

#ifdef DECIDE_GLIBC_BASE
__asm__(".symver exp,exp@" DECIDE_GLIBC_BASE);
__asm__(".symver exp2,exp2@" DECIDE_GLIBC_BASE);
__asm__(".symver log,log@" DECIDE_GLIBC_BASE);
__asm__(".symver log2,log2@" DECIDE_GLIBC_BASE);
__asm__(".symver pow,pow@" DECIDE_GLIBC_BASE);
#endif
