"""What each chapter of the book says about its measurements: its ``summary.json`` headline, its
closing "what we saw" text (computed, not typed) and its tables for display — one module per chapter
notebook, named after it.

========================  ===================================================================
module                    chapter (``notebooks/``) and what it presents
========================  ===================================================================
:mod:`.diagnosis`         01: Table 1 and Fig. 2 from the Lab's rows (:mod:`moir_lib.experiments`)
:mod:`.generation`        02: seed strategies' samples (:mod:`moir_lib.analysis.selfgen`), Fig. 10
:mod:`.nll_jsd`           03: NLL, JSD and coverage (:mod:`moir_lib.analysis.alignment`), Figs. 3, 7, 11
:mod:`.g_cancellation`    04: the proof check's numbers (:mod:`moir_lib.theory`)
:mod:`.editing`           05: Tables 2 and 5-9, Fig. 6 and the explorer, from the Lab's rows
:mod:`.causal_tracing`    06: the traced window (:mod:`moir_lib.tracing`), appendix C.4's table
:mod:`.lab_tables`        what 01 and 05 share: wide rows, Table 5, curves, distortion, notes
========================  ===================================================================

Each chapter module names its run directory (``CHAPTER``); :mod:`moir_lib.results` writes every
chapter's ``summary.json`` and tidy tables. The chapters import the measuring modules, never the
reverse: only the command line (:mod:`moir_lib.cli`) imports a chapter module.
"""
