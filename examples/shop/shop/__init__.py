"""A small shop: orders placed over HTTP, shipped by a sqla-jobs worker in the order's own
database, with the job enqueued in the transaction that creates the order."""
