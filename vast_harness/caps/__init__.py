"""The caps: the cost meter, the run's one clock and every phase's deadline under the time and dollar caps
(`meter`), and the cap guard, a thread that deletes the run's instances when the cap is near and the run has not
begun to (`guard`).

They stand apart from the run so that every phase asks one meter for its deadline and none keeps its own.
"""
