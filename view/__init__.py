"""``dxi view``: a local, read-only web app over the cache and the datasets (``app`` serves,
``data`` queries). See docs/view.md."""
