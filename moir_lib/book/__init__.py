"""The HTML book (``moir book``): execute the chapters side by side, stage them, build with jupyter-book.

========================  ===============================================================
module                    owns
========================  ===============================================================
:mod:`.site`             ``build_book``: the whole build (its output locked); jupyter-book in a fresh
                          folder, swapped in
:mod:`.commits`           the commit each page ran at, against the book's: marked, or refused
:mod:`.execute`           ``execute_book``: chapters and the pocket reports in worker processes
:mod:`.pooled_organisms`         which pocket organisms a book runs, their builds, their provenance table
:mod:`.merge`             ``merged_runs``: a chapter run once per organism, merged for ``--from``
:mod:`.progress`          what the terminal (live lines) or a log (plain lines) shows meanwhile
:mod:`.stage`             ``collect_executed``, ``stage_book``: the executed chapters beside the
                          book's sources, the provenance and claims tables, the computed pages
========================  ===============================================================

One chapter is run by :func:`moir_lib.runs.run_notebook` (``moir run``), which the workers call.
"""

from __future__ import annotations

from moir_lib.book.execute import default_jobs, execute_book
from moir_lib.book.site import BookSettings, build_book
from moir_lib.book.stage import Executed, check_executed, claims_table, collect_executed, toc_chapters

__all__ = ["BookSettings", "Executed", "build_book", "check_executed", "claims_table", "collect_executed",
           "default_jobs", "execute_book", "toc_chapters"]
