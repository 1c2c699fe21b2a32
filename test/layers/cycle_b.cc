// Not compiled: see cycle_a.h. launcher/cycle_b.h need not exist: the module is cycle_b.
#include "launcher/cycle_a.h"
