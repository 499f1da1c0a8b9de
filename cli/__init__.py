"""The ``emgrid`` command: config files, plan, fit, advise, demo."""
