// Not compiled: see cycle_a.h. launcher/plan/cycle_b.h need not exist: the module is cycle_b.
#include "launcher/plan/cycle_a.h"
