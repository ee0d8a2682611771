"""What a run leaves on disk: its evidence directory (the layout, the typed run record written as
`harness-result.json`, the closing manifest) and the one tolerant reader of the files a rented host wrote.

The reports and the read-only views read a run through here, so anything shown about a run can be rebuilt from
its files alone.
"""
