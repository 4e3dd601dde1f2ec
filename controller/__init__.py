from trimtab import refuse_bare_import

refuse_bare_import(__name__)
