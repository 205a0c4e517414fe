/* include/idem/idem.h - all of libidem's public API in one include.
 *
 * A service that embeds libidem includes this one header; the per-concept
 * headers beside it stay includable on their own for code that needs only
 * one of them (each includes what it uses).  Every public header in
 * include/idem/ is listed here: a new header is added to this list in the
 * same change that creates it.
 */
#ifndef IDEM_IDEM_H
#define IDEM_IDEM_H

#include "idem/version.h"
#include "idem/error.h"
#include "idem/alloc.h"
#include "idem/clock.h"
#include "idem/random.h"
#include "idem/retry.h"
#include "idem/units.h"
#include "idem/key.h"
#include "idem/fingerprint.h"
#include "idem/record.h"
#include "idem/engine.h"
#include "idem/token.h"
#include "idem/store.h"
#include "idem/tx.h"
#include "idem/fsm.h"
#include "idem/dedup.h"
#include "idem/lock.h"

#endif /* IDEM_IDEM_H */
