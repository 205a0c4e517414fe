/* include/idem/extern.h - which declarations are libidem's API.
 *
 * libidem is compiled with hidden visibility (-fvisibility=hidden: meson's
 * gnu_symbol_visibility 'hidden' on src/core, src/store and src/tx), so a
 * function or variable of the library is exported from libidem.so only when
 * its declaration says so.  Every declaration of the public API in
 * include/idem/ begins with IDEM_EXTERN; everything else, the idem__
 * internals and their test hooks among them, stays inside the library.  The
 * lint test 'exports' (scripts/check_exports.py) keeps the two lists equal:
 * libidem.so exports exactly the names the headers mark, and every function
 * a public header declares is marked.  docs/library.md says how to add one.
 *
 * With GCC and Clang (__GNUC__ 4 and later) IDEM_EXTERN gives default
 * visibility, as libuv's UV_EXTERN does; the mark on the definition's
 * declaration is what exports it, and in a program that only calls libidem
 * it changes nothing.  With another compiler it is empty, and the library
 * exports what a build without visibility would.
 *
 * The static library.  libidem.a holds the same objects as libidem.so,
 * with the same visibility: its internals are hidden, so a program or a
 * shared object that links libidem.a exports none of them, while the public
 * API keeps default visibility (a shared object that must not re-export it
 * links with -Wl,--exclude-libs,libidem.a).  A project that compiles
 * libidem's sources into its own code instead may define IDEM_EXTERN itself
 * before any idem header: empty (-DIDEM_EXTERN=), with -fvisibility=hidden,
 * exports nothing of libidem from what it builds.  This header keeps a
 * definition it finds.
 */
#ifndef IDEM_EXTERN_H
#define IDEM_EXTERN_H

#ifndef IDEM_EXTERN
#if defined(__GNUC__) && __GNUC__ >= 4
#define IDEM_EXTERN __attribute__((visibility("default")))
#else
#define IDEM_EXTERN
#endif
#endif

#endif /* IDEM_EXTERN_H */
