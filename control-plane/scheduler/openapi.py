DOCUMENT = {"openapi": "3.0.3", "info": {"title": "x", "version": "0.1.0"}, "paths": {}}
