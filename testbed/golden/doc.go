// Package golden holds the regression guards of the deterministic virtual-time engine to exact figures: a test
// collects named figures of its runs (Figures) and Check compares them with a golden file under testdata, naming
// every figure that moved, from what to what. Run with -update to rewrite the file from the figures measured now,
// then read the diff before committing it: the golden file is the record of what the engine measures.
//
// A figure is only as good as its samples: Class refuses a class that produced none (a latency of no requests is no
// measurement), so a scenario that stopped exercising a class fails instead of passing on an empty figure.
//
// Figures are exact because runs are: the same code and configuration give byte-identical records (see package
// virtualbench). They are exact for one platform's floating point; the guards run on linux/amd64.
package golden
